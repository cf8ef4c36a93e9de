"""A quantized base traded back for speed: load the frozen base in bf16 and keep LoRA (no dequantization in any
matmul), or, where only the quantized base fits, keep it and spend the memory it saves on a larger micro-batch.

Which of the two is the planner's verdict (``pitstop plan --method lora`` against ``--method qlora`` for the
same model, GPU, row length and micro-batch): the rule passes it in. Either changes what the job loads and
holds, and a bf16 base computes with the unquantized weights (slightly different losses), so it is advice, not
a tune trial: a trial cannot reload the job's model in another precision from outside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, code, register


@register
class Bf16Lora(Remedy):
    id = RemedyId.BF16_LORA
    title = "bf16 base with LoRA instead of a quantized base"
    effect = "the base's weights unquantized: no dequantization per matmul; more memory"
    preserves_computation = False  # the bf16 weights are not the quantized ones: losses differ slightly

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``bf16_fits``: the planner's verdict for a bf16 base at the same micro-batch (None: not planned);
        ``bf16_gib`` / ``gpu_gib``: its peak and the GPU's memory; ``micro_batch``: the job's;
        ``micro_batch_fits``: the largest micro-batch the planner fits with the quantized base;
        ``bits``: 4 or 8; ``compute_dtype``: the dtype the dequantized weights are multiplied in."""
        fits, bits = params.get("bf16_fits"), params.get("bits") or 4
        bf16_gib, gpu_gib = params.get("bf16_gib"), params.get("gpu_gib")
        micro, bigger = params.get("micro_batch"), params.get("micro_batch_fits")
        planned = (
            f" ({bf16_gib:.1f} GiB of the GPU's {gpu_gib:.0f} GiB, planned)" if bf16_gib and gpu_gib else ""
        )
        load_bf16 = (
            "load the base in bf16 (drop the BitsAndBytesConfig / quantization_config, dtype=torch.bfloat16) "
            "and keep LoRA on it"
        )
        raise_micro = (
            f"raise the micro-batch to {bigger} (from {micro}), the largest the planner fits with the "
            f"{bits}-bit base, and lower gradient accumulation to keep the global batch"
            if bigger and micro and bigger > micro
            else "raise the micro-batch into the memory the quantized base saves (`pitstop plan --micro-batch "
            "auto --method qlora` finds the largest), lowering gradient accumulation to keep the global batch"
        )
        if fits is True:
            text = (
                f"You trade speed for memory you do not need: bf16 LoRA of this model fits at this micro-batch"
                f"{planned}, so {load_bf16}; every matmul then skips the dequantization. Or keep the "
                f"{bits}-bit base and {raise_micro}."
            )
        elif fits is False:
            text = (
                f"Keep the {bits}-bit base: bf16 LoRA would not fit at this micro-batch{planned}. Spend the memory "
                f"it saves instead: {raise_micro}."
            )
        else:
            text = (
                f"Weigh the trade: compare `pitstop plan --model <config.json> --gpu <GPU> --seq <row length> "
                f"--micro-batch <micro-batch> --method lora` against `--method qlora`. Where bf16 LoRA fits, "
                f"{load_bf16}; where it does not, {raise_micro}."
            )
        if params.get("compute_dtype") == "float32":
            text += (
                " The dequantized weights are multiplied in fp32 (bnb_4bit_compute_dtype unset or float32): "
                "bnb_4bit_compute_dtype=torch.bfloat16 runs those matmuls in bf16."
            )
        return Advice(text, self._snippet(framework, fits))

    def _snippet(self, framework: Framework, fits: bool | None) -> str:
        bf16 = code("""
            # bf16 base, LoRA kept: no BitsAndBytesConfig, no prepare_model_for_kbit_training
            model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16)  # torch_dtype= before 4.56
            model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))
        """)
        quantized = code("""
            # or keep the 4-bit base, its matmuls in bf16, and a larger micro-batch
            bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                     bnb_4bit_compute_dtype=torch.bfloat16)
        """)
        if framework is Framework.TRL:
            bf16 += "\n" + code("""
                # or with trl's ModelConfig: load_in_4bit=False, load_in_8bit=False, dtype="bfloat16"
            """)
        if framework.is_trainer:
            quantized += (
                f"\nargs = {framework.args_class}(..., per_device_train_batch_size=<larger>, "
                "gradient_accumulation_steps=<smaller>)"
            )
        else:
            quantized += (
                "\nloader = DataLoader(dataset, ..., batch_size=<larger>)  # fewer accumulation steps"
            )
        return quantized if fits is False else f"{bf16}\n{quantized}"

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.ACCELERATE, Framework.PYTORCH)
