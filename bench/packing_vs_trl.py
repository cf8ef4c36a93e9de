"""Packing: pitstop's ``plan_packing`` vs TRL's ``pack_dataset(strategy="bfd")``, rows and planning time.

Lengths are real token counts (GPT-2 tokenizer) of gsm8k (question + answer) and the Alpaca demo
(instruction + input + output), and 1,000,000 lengths resampled (seed 0, with replacement) from both. TRL is
timed end to end on its public API (the input ``Dataset`` is built outside the timing); it packs through
``datasets.map`` in windows of 1,000 examples, and its row count is reported as it returns it. Both truncate
examples longer than the row. Ratios: TRL seconds / pitstop seconds, and rows over the lower bound.

    python bench/packing_vs_trl.py                  # about 1.5 minutes
    python bench/packing_vs_trl.py --json /tmp/packing.json --repeats 3 --big-repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # ../shared beside the checkout
GSM8K = DATA / "datasets" / "gsm8k_train.jsonl"
ALPACA = DATA / "datasets" / "alpaca_en_demo.json"
TOKENIZER = DATA / "tokenizers" / "gpt2_tokenizer.json"


def token_lengths() -> dict[str, np.ndarray]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER))
    gsm = [json.loads(line) for line in GSM8K.read_text().splitlines() if line.strip()]
    alpaca = json.loads(ALPACA.read_text())
    texts = {
        "gsm8k": [f"{r['question']}\n{r['answer']}" for r in gsm],
        "alpaca": [f"{r['instruction']}\n{r.get('input') or ''}\n{r['output']}" for r in alpaca],
    }
    return {
        name: np.array([len(e.ids) for e in tok.encode_batch(t)], dtype=np.int64) for name, t in texts.items()
    }


def trl_input(lengths: np.ndarray) -> Any:
    """A ``datasets.Dataset`` whose ``input_ids`` lists have the given lengths (int32 ids, all zero)."""
    import pyarrow as pa
    from datasets import Dataset
    from datasets.table import InMemoryTable

    offsets = np.zeros(lengths.size + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.zeros(int(offsets[-1]), dtype=np.int32)))
    return Dataset(InMemoryTable(pa.table({"input_ids": ids})))


def time_pitstop(lengths: np.ndarray, max_len: int, repeats: int) -> tuple[Any, float]:
    from pitstop.data import plan_packing

    times, plan = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        plan = plan_packing(lengths, max_len)
        times.append(time.perf_counter() - t0)
    return plan, statistics.median(times)


def time_trl(dataset: Any, max_len: int, repeats: int) -> tuple[int, float]:
    from trl.data_utils import pack_dataset

    times, rows = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        rows = len(pack_dataset(dataset, max_len, strategy="bfd"))
        times.append(time.perf_counter() - t0)
    return rows, statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per small case (median)")
    parser.add_argument("--big-repeats", type=int, default=2, help="timed runs per 1M case (median)")
    parser.add_argument("--big", type=int, default=1_000_000, help="resampled lengths in the big cases")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    missing = [str(p) for p in (GSM8K, ALPACA, TOKENIZER) if not p.is_file()]
    if missing:
        print(f"missing input data: {', '.join(missing)}", file=sys.stderr)
        return 2
    import datasets

    datasets.disable_progress_bars()
    real = token_lengths()
    pool = np.concatenate(list(real.values()))
    big = np.random.default_rng(0).choice(pool, size=args.big, replace=True)
    cases: list[tuple[str, np.ndarray, int, int]] = [
        *((name, lengths, m, args.repeats) for name, lengths in real.items() for m in (512, 1024)),
        *((f"resampled {args.big:,}", big, m, args.big_repeats) for m in (2048, 4096)),
    ]
    for name, lengths in real.items():
        print(f"{name}: {lengths.size:,} examples, mean {lengths.mean():.0f} / max {lengths.max()} tokens")
    head = (
        f"{'case':22} {'max_len':>7} {'lower bd':>9} {'pitstop rows':>12} {'TRL rows':>9} {'TRL/pit rows':>12} "
        f"{'pitstop s':>10} {'TRL s':>8} {'TRL/pit time':>12}"
    )
    print(head + "\n" + "-" * len(head))
    results = []
    for name, lengths, max_len, repeats in cases:
        plan, pit_s = time_pitstop(lengths, max_len, max(repeats, 3))
        trl_rows, trl_s = time_trl(trl_input(lengths), max_len, repeats)
        rows = len(plan.piece_rows)
        print(
            f"{name:22} {max_len:7} {plan.lower_bound:9,} {rows:12,} {trl_rows:9,} {trl_rows / rows:12.4f} "
            f"{pit_s:10.4f} {trl_s:8.3f} {trl_s / pit_s:11.1f}x"
        )
        results.append(
            {"case": name, "examples": int(lengths.size), "max_len": max_len, "lower_bound": plan.lower_bound,
             "pitstop_rows": rows, "trl_rows": trl_rows, "pitstop_efficiency": plan.efficiency,
             "pitstop_seconds": pit_s, "trl_seconds": trl_s, "trl_timed_runs": repeats,
             "speed_ratio": trl_s / pit_s}
        )  # fmt: skip
    print(
        f"pitstop: median of >=3 runs; TRL: median of {args.repeats} runs (small), "
        f"{args.big_repeats} run(s) (resampled); TRL packs in datasets.map windows of 1,000 examples"
    )
    worse = [r["case"] + f"@{r['max_len']}" for r in results if r["pitstop_rows"] > r["trl_rows"]]
    print("pitstop needs more rows than TRL in: " + (", ".join(worse) if worse else "no case"))
    if args.json:
        args.json.write_text(json.dumps({"cases": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
