"""A plain PyTorch loop on a tiny Mixtral (Transformers' own MoE model, random weights) that plants
moe_experts_loop: many small experts (32, top-2) run with ``experts_implementation="eager"``, Transformers'
loop over the experts hit, so the experts dominate the step on a CPU. ``--experts grouped_mm`` is the clean run
(the grouped GEMM Transformers loads by default); ``--experts loop`` swaps the expert modules for an
``nn.ModuleList`` of per-expert MLPs looped over in the block's forward, as Transformers < 5 and remote code
hold them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

VOCAB = 512


def tiny_mixtral(experts_implementation: str, experts: int = 32, layers: int = 2) -> Any:
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=experts,
        num_experts_per_tok=2,
        max_position_embeddings=256,
        use_cache=False,
        tie_word_embeddings=False,
    )
    return MixtralForCausalLM._from_config(config, experts_implementation=experts_implementation)


class ExpertMlp(torch.nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.w1 = torch.nn.Linear(hidden, inter, bias=False)
        self.w3 = torch.nn.Linear(hidden, inter, bias=False)
        self.w2 = torch.nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class LoopedMoe(torch.nn.Module):
    """Transformers 4.x's MixtralSparseMoeBlock: a router and an nn.ModuleList of experts looped over."""

    def __init__(self, hidden: int, inter: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.gate = torch.nn.Linear(hidden, experts, bias=False)
        self.experts = torch.nn.ModuleList(ExpertMlp(hidden, inter) for _ in range(experts))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = hidden_states.shape
        flat = hidden_states.view(-1, dim)
        weights, chosen = torch.softmax(self.gate(flat), dim=-1).topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(flat)
        for i, expert in enumerate(self.experts):
            rows, slot = torch.where(chosen == i)
            if rows.numel():
                out.index_add_(0, rows, expert(flat[rows]) * weights[rows, slot, None])
        return out.view(batch, seq, dim)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--experts", choices=("eager", "grouped_mm", "loop"), default="eager")
    p.add_argument("--losses", type=Path, default=None, help="append the loss of every step here")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = tiny_mixtral("eager" if args.experts == "loop" else args.experts)
    if args.experts == "loop":
        for layer in model.model.layers:
            layer.mlp = LoopedMoe(64, 128, 32, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(3, VOCAB, (8, 64))
    out = args.losses.open("w") if args.losses is not None else None
    for _ in range(args.steps):
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if out is not None:  # each step as it ends: pitstop doctor stops the job after its window
            print(repr(loss.item()), file=out, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
