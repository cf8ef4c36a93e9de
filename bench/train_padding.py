"""End-to-end CPU training throughput: padded random batches vs length-grouped batches vs packed rows.

A tiny Llama (vocab 4096, hidden 64, 2 layers, 2 heads, sdpa, ``use_cache=False``) trains on the gsm8k
cache (GPT-2 tokenizer, Alpaca template; token ids folded into the small vocabulary by ``id % 4096``):
(i) random batches of 8 examples padded to the longest; (ii) ``LengthGroupedBatchSampler`` batches of 8,
padded the same way; (iii) ``PackedDataset(max_len=1024)`` rows, 2 per batch, ``PackingCollator("sdpa")``;
(iv) the same with 512-token rows, 4 per batch (SDPA with a dense 4-D mask computes attention over the whole
row, so on a CPU the row length trades padding saved against attention spent).
Each block is ``--warmup`` untimed steps then ``--steps`` timed optimizer steps, batch loading and collation
included (DataLoader, no workers); blocks interleave (i, ii, iii, i, ...) for ``--rounds`` rounds. The
figure is real (non-padding) tokens per second; the table shows medians and the ratio to (i).

    python bench/train_padding.py                # about 1 minute
    python bench/train_padding.py --json /tmp/train_padding.json --rounds 3 --steps 30 --warmup 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from pitstop import data as ps

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # ../shared beside the checkout
GSM8K = DATA / "datasets" / "gsm8k_train.jsonl"
TOKENIZER = DATA / "tokenizers" / "gpt2_tokenizer.json"
VOCAB = 4096


def tiny_llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                         use_cache=False, pad_token_id=0, tie_word_embeddings=False)  # fmt: skip
    return LlamaForCausalLM._from_config(config, attn_implementation="sdpa")


def pad_collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Pad to the longest example of the batch; padding has attention_mask 0 and label -100."""
    width = max(len(item["input_ids"]) for item in items)
    ids = torch.zeros((len(items), width), dtype=torch.long)
    labels = torch.full((len(items), width), -100, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        ids[row, :n] = torch.from_numpy(item["input_ids"])
        labels[row, :n] = torch.from_numpy(item["labels"])
        mask[row, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask, "real_tokens": int(mask.sum())}


def fold(batch: dict[str, Any]) -> tuple[dict[str, Any], int, int]:
    """Map token ids into the small vocabulary; also (real tokens, token slots) of the batch."""
    ids, labels = batch["input_ids"], batch["labels"]
    batch["input_ids"] = ids % VOCAB
    batch["labels"] = torch.where(labels >= 0, labels % VOCAB, labels)
    return batch, int(batch.pop("real_tokens")), ids.numel()


class Mode:
    """One way of batching, with its own model, optimizer and endless batch iterator."""

    def __init__(self, loader: DataLoader) -> None:
        torch.manual_seed(0)
        self.loader = loader
        self.model = tiny_llama()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.batches = self._endless()

    def _endless(self) -> Iterator[dict[str, Any]]:
        while True:
            yield from self.loader

    def block(self, warmup: int, steps: int) -> tuple[float, float]:
        """(real tokens/s, padding share) over ``steps`` timed optimizer steps after ``warmup``."""
        real = slots = 0
        for step in range(warmup + steps):
            if step == warmup:
                real = slots = 0
                t0 = time.perf_counter()
            batch, n_real, n_slots = fold(next(self.batches))
            loss = self.model(**batch).loss
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            real, slots = real + n_real, slots + n_slots
        return real / (time.perf_counter() - t0), 1 - real / slots


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30, help="timed optimizer steps per block")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps at the start of each block")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    missing = [str(p) for p in (GSM8K, TOKENIZER) if not p.is_file()]
    if missing:
        print(f"missing input data: {', '.join(missing)}", file=sys.stderr)
        return 2
    torch.set_num_threads(2)
    packer = ps.PackingCollator("sdpa")

    def packed_collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {**packer(rows), "real_tokens": sum(int(n) for r in rows for n in r["seq_lens"])}

    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        cache = ps.build_cache(GSM8K, TOKENIZER, tmp, template="auto")
        examples = ps.CachedExamples(cache)
        grouped = ps.LengthGroupedBatchSampler(examples.lengths, 8)
        modes = {
            "(i) padded, random 8": Mode(DataLoader(examples, batch_size=8, shuffle=True, collate_fn=pad_collate,
                                                    generator=torch.Generator().manual_seed(0))),
            "(ii) length-grouped 8": Mode(DataLoader(examples, batch_sampler=grouped, collate_fn=pad_collate)),
            "(iii) packed 2 x 1024": Mode(DataLoader(ps.PackedDataset(cache, max_len=1024), batch_size=2,
                                                     collate_fn=packed_collate)),
            "(iv) packed 4 x 512": Mode(DataLoader(ps.PackedDataset(cache, max_len=512), batch_size=4,
                                                   collate_fn=packed_collate)),
        }  # fmt: skip
        rates: dict[str, list[float]] = {name: [] for name in modes}
        padding: dict[str, list[float]] = {name: [] for name in modes}
        for _ in range(args.rounds):
            for name, mode in modes.items():
                rate, pad = mode.block(args.warmup, args.steps)
                rates[name].append(rate)
                padding[name].append(pad)
    base = statistics.median(rates["(i) padded, random 8"])
    print(
        f"tiny Llama (vocab {VOCAB}, hidden 64, 2 layers, sdpa) on gsm8k; {args.rounds} rounds x "
        f"({args.warmup} warm-up + {args.steps} timed steps) per mode, torch threads 2"
    )
    head = f"{'mode':24} {'real tokens/s':>14} {'min-max over rounds':>21} {'padding':>8} {'vs padded':>10}"
    print(head + "\n" + "-" * len(head))
    results = []
    for name, values in rates.items():
        rate = statistics.median(values)
        pad = statistics.median(padding[name])
        print(
            f"{name:24} {rate:14,.0f} {min(values):10,.0f}-{max(values):<10,.0f} {pad:8.1%} {rate / base:8.2f}x"
        )
        results.append({"mode": name, "real_tokens_per_s": rate, "rounds": values, "padding_share": pad,
                        "ratio_vs_padded": rate / base})  # fmt: skip
    print("padding: share of token slots that are padding (packed: row tails); vs padded: ratio of medians")
    if args.json:
        args.json.write_text(json.dumps({"modes": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
