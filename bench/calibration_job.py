"""A small CPU training job with one planted cause, for ``bench/calibration.py``: a tiny Llama on synthetic
token ids of varied lengths, in a plain PyTorch loop, with knobs that plant padding (``--pad-to``), a slow
loader (``--slow-ms`` per example), eager attention (``--attn eager``, longer rows with ``--len-hi``) or
activation checkpointing on a model that fits (``--checkpointing``)."""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import torch

VOCAB = 512
PAD = 0


def model_of(args: argparse.Namespace) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=max(args.pad_to or 0, args.len_hi) + 8,
        use_cache=False,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM._from_config(config, attn_implementation=args.attn)
    if args.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


class Examples(torch.utils.data.Dataset):
    """Token ids of ``lo``–``hi`` tokens; ``slow_ms`` is a blocking read per example (slow storage)."""

    def __init__(self, n: int, lo: int, hi: int, slow_ms: float, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.rows = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
        self.slow_ms = slow_ms

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        if self.slow_ms:
            time.sleep(self.slow_ms / 1000.0)
        return {"input_ids": self.rows[i]}


def collate_to(pad_to: int | None) -> Any:
    """Rows padded to ``pad_to`` tokens, or to the batch's longest example."""

    def collate(batch: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        length = pad_to or max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), length), PAD, dtype=torch.long)
        mask = torch.zeros((len(batch), length), dtype=torch.long)
        for row, b in enumerate(batch):
            seq = b["input_ids"][:length]
            ids[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    return collate


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--attn", default="sdpa")
    p.add_argument("--pad-to", type=int, default=None)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--len-lo", type=int, default=16)
    p.add_argument("--len-hi", type=int, default=120)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a busy machine)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = Examples(2048, args.len_lo, args.len_hi, args.slow_ms)
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=args.batch,
        shuffle=True,
        collate_fn=collate_to(args.pad_to),
        generator=torch.Generator().manual_seed(0),
    )
    model = model_of(args)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    while step < args.steps:
        for batch in loader:
            model(**batch).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step >= args.steps:
                break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
