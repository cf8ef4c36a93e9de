"""A plain PyTorch QLoRA loop on a tiny Llama (Transformers' own model, random weights saved and loaded back)
that plants quantized_base: the base loaded through ``BitsAndBytesConfig(load_in_4bit=True)`` (NF4, double
quantization), LoRA adapters from PEFT on its attention projections, and short rows, so the weights'
dequantization at every matmul (forward and backward) is a large share of each step on a CPU. ``--base dense``
is the clean run: the same model and adapters on unquantized weights."""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

import torch

VOCAB = 512


def qlora_model(base: str, compute: str, hidden: int = 512, layers: int = 4) -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=256,
        use_cache=False,
        tie_word_embeddings=False,
    )
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(folder)
        quantization = (
            BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=getattr(torch, compute),
            )
            if base == "4bit"
            else None
        )
        model = AutoModelForCausalLM.from_pretrained(
            folder, quantization_config=quantization, device_map="cpu", dtype=torch.float32
        )
    lora = LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--base", choices=("4bit", "dense"), default="4bit")
    p.add_argument("--compute", choices=("float32", "bfloat16"), default="float32")
    args = p.parse_args()
    torch.set_num_threads(2)
    model = qlora_model(args.base, args.compute)
    model.train()
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-4)
    batch = torch.randint(3, VOCAB, (2, 32), generator=torch.Generator().manual_seed(1))
    for _ in range(args.steps):
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
