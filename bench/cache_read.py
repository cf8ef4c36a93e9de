"""Reading a token cache: tokens/s served by ``PackedDataset`` rows, with and without ``PackingCollator``,
against what one H100 consumes training a Llama-3.2-1B-like model at 50% MFU.

The cache is gsm8k repeated until it holds at least ``--min-tokens`` tokens (GPT-2 tokenizer, Alpaca
template), rows of 2,048 tokens. Modes, one process, no DataLoader workers: (a) ``PackedDataset[i]`` for
every row; (b) the same, collated 8 rows at a time with ``PackingCollator("sdpa")`` (which builds a 4-D
8×1×2048×2048 boolean mask per batch); (c) ``PackingCollator("flash_attention_2")`` (flattened, no mask).
Each mode reads rows for at most ``--seconds`` per round; rounds interleave the modes; medians are shown.
The needed rate is computed below (``needed_tokens_per_s``); the ratio is served / needed.

    python bench/cache_read.py                   # about 1 minute
    python bench/cache_read.py --json /tmp/cache_read.json --rounds 3 --seconds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # ../shared beside the checkout
GSM8K = DATA / "datasets" / "gsm8k_train.jsonl"
TOKENIZER = DATA / "tokenizers" / "gpt2_tokenizer.json"
H100_BF16_PEAK = 989.4e12  # dense BF16 FLOP/s
MFU = 0.5
PARAMS, LAYERS, D_ATTN, CONTEXT = 1.236e9, 16, 2048, 2048  # Llama-3.2-1B-like


def needed_tokens_per_s() -> tuple[float, float]:
    """(FLOPs per token, tokens/s) for training at MFU on one H100: 6N + 12 * layers * d_attn * T."""
    flops_per_token = 6 * PARAMS + 12 * LAYERS * D_ATTN * CONTEXT
    return flops_per_token, H100_BF16_PEAK * MFU / flops_per_token


def read_for(
    dataset: Any,
    collate: Callable[[list[dict[str, Any]]], Any] | None,
    batch: int,
    start: int,
    seconds: float,
) -> tuple[int, float, int]:
    """Read rows from ``start`` (wrapping) for about ``seconds``: (real tokens, elapsed, next row)."""
    n, tokens, i = len(dataset), 0, start
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        rows = [dataset[(i + k) % n] for k in range(batch)]
        i = (i + batch) % n
        if collate is not None:
            collate(rows)
        tokens += sum(len(r["input_ids"]) for r in rows)
    return tokens, time.perf_counter() - t0, i


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min-tokens", type=int, default=5_000_000)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8, help="rows per collated batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="reading time per mode per round")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    missing = [str(p) for p in (GSM8K, TOKENIZER) if not p.is_file()]
    if missing:
        print(f"missing input data: {', '.join(missing)}", file=sys.stderr)
        return 2
    import torch

    from pitstop.data import PackedDataset, PackingCollator, build_cache, open_cache

    torch.set_num_threads(2)
    flops_per_token, needed = needed_tokens_per_s()
    with tempfile.TemporaryDirectory(prefix="bench-read-") as tmp:
        text = GSM8K.read_text()
        text = text if text.endswith("\n") else text + "\n"
        copies = 1
        while True:  # grow the file until the cache holds enough tokens
            data = Path(tmp) / f"gsm8k_x{copies}.jsonl"
            data.write_text(text * copies)
            cache = open_cache(build_cache(data, TOKENIZER, Path(tmp) / "cache", template="auto"))
            if cache.meta.tokens >= args.min_tokens:
                break
            copies = -(-args.min_tokens * copies // cache.meta.tokens)
        dataset = PackedDataset(cache, max_len=args.max_len)
        modes: dict[str, tuple[Callable[[list[dict[str, Any]]], Any] | None, int]] = {
            "(a) PackedDataset rows": (None, 1),
            f"(b) + collator sdpa, {args.batch} rows": (PackingCollator("sdpa"), args.batch),
            f"(c) + collator flash_attention_2, {args.batch} rows": (
                PackingCollator("flash_attention_2"),
                args.batch,
            ),
        }
        rates: dict[str, list[float]] = {name: [] for name in modes}
        position = dict.fromkeys(modes, 0)
        for collate, batch in modes.values():  # warm-up: page cache, first allocations
            read_for(dataset, collate, batch, 0, 0.5)
        for _ in range(args.rounds):
            for name, (collate, batch) in modes.items():
                tokens, elapsed, position[name] = read_for(
                    dataset, collate, batch, position[name], args.seconds
                )
                rates[name].append(tokens / elapsed)
        print(
            f"cache: gsm8k x{copies}, {cache.meta.examples:,} examples, {cache.meta.tokens:,} tokens, "
            f"{len(dataset):,} rows of <= {args.max_len} (efficiency {dataset.plan.efficiency:.4f})"
        )
    print(
        f"needed: H100 {H100_BF16_PEAK / 1e12:.1f} TFLOP/s x {MFU:.0%} MFU / {flops_per_token / 1e9:.3f} GFLOP per "
        f"token (6N + 12*L*d*T, N={PARAMS:.4g}) = {needed:,.0f} tokens/s"
    )
    head = f"{'mode':42} {'tokens/s (median)':>18} {'min-max over rounds':>25} {'served/needed':>14} {'>=100x':>7}"
    print(head + "\n" + "-" * len(head))
    results = []
    for name, values in rates.items():
        rate = statistics.median(values)
        ratio = rate / needed
        print(
            f"{name:42} {rate:18,.0f} {min(values):12,.0f}-{max(values):,.0f} {ratio:13.1f}x "
            f"{'yes' if ratio >= 100 else 'NO':>7}"
        )
        results.append({"mode": name, "tokens_per_s": rate, "rounds": values, "served_over_needed": ratio})
    print(f"median of {args.rounds} rounds x {args.seconds:g} s per mode; one process, torch threads 2")
    if args.json:
        doc = {
            "needed_tokens_per_s": needed,
            "flops_per_token": flops_per_token,
            "cache_tokens": cache.meta.tokens,
            "modes": results,
        }
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
