"""bf16 mixed precision: matrix math on bf16 tensor cores, no loss scaling needed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.autocast import autocast_every_forward
from pitstop.remedies.base import Advice, Remedy, TrialFacts, code, register
from pitstop.trials.request import FixReport, FixRequest


def mixed_precision_advice(framework: Framework, low: str, text: str) -> Advice:
    """The one snippet builder for bf16 and fp16 (fp16 adds the loss scaler a plain loop needs)."""
    dtype = "torch.bfloat16" if low == "bf16" else "torch.float16"
    snippets = {
        Framework.HF_TRAINER: f"args = TrainingArguments(..., {low}=True)",
        Framework.TRL: f"config = SFTConfig(..., {low}=True)",
        Framework.ACCELERATE: f'accelerator = Accelerator(mixed_precision="{low}")',
        # Lightning names fp16 "16-mixed" ("fp16-mixed" is no precision it takes)
        Framework.LIGHTNING: f'trainer = L.Trainer(..., precision="{"bf16" if low == "bf16" else "16"}-mixed")',
        Framework.DEEPSPEED: f'"{low}": {{"enabled": true}}',
    }
    if framework in snippets:
        return Advice(text, snippets[framework])
    body = code(f"""
        with torch.autocast("cuda", dtype={dtype}):
            loss = model(**batch).loss
    """)
    if low == "fp16":
        body = code("""
            scaler = torch.amp.GradScaler()                  # fp16 needs loss scaling
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(**batch).loss
            scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
        """)
    return Advice(text, body)


@register
class Bf16(Remedy):
    id = RemedyId.BF16
    title = "bf16 autocast"
    tune_rank = 90
    effect = "changes numerics (bf16 matmuls)"
    preserves_computation = False
    tunable = True

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``inference``: the trace is inference or evaluation: the weights themselves can be bf16 (no master
        copy, no optimizer), not only the matmuls under autocast."""
        if params.get("inference"):
            return Advice(
                "Run the forward in bf16: inference keeps no master weights, so the model itself can be cast.",
                "model = model.to(torch.bfloat16)   # and run it under torch.inference_mode()\n",
            )
        return mixed_precision_advice(framework, "bf16", "Train in bf16 mixed precision.")

    def cannot_try(self, facts: TrialFacts) -> str | None:
        if not facts.on_gpu:
            return "bf16 autocast pays off on GPU tensor cores"
        if facts.gpu_has_bf16 is False:
            return "this GPU has no bf16 tensor cores (emulated bf16 is slower): fp16 instead"
        return None

    def on_first_forward(self, model: Any, request: FixRequest, report: FixReport) -> None:
        device = autocast_every_forward(model, "bfloat16")
        report.apply(self.id, f"{type(model).__name__} forward under bf16 autocast ({device})")

    def rewrite_training_args(self, args: Any, request: FixRequest, report: FixReport) -> None:
        args.bf16, args.fp16 = True, False
        report.apply(self.id, "TrainingArguments(bf16=True)")
