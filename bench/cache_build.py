"""Tokenizing into a cache: pitstop's ``build_cache`` vs ``datasets.Dataset.from_json(...).map(batched=True)``.

Input: gsm8k repeated ``--repeat`` times into a temporary JSONL. Both sides use the GPT-2 tokenizer and produce
ids plus a loss mask for the Alpaca prompt (not trained on) and the answer + EOS (trained on); pitstop with
``template="auto"`` (Alpaca here), datasets through ``PreTrainedTokenizerFast`` with prompt and answer
tokenized in one batched call each. Every timed run is a fresh process with a fresh output / cache folder and
``datasets.disable_caching()``, so nothing is reused and no tokenizer state crosses runs; the datasets side is
from_json + map only (nothing saved to disk after). Variants run alternately, ``--runs`` times each; the
table shows medians and the ratio to datasets.map with the same number of processes. The tokenizers library
runs its own threads inside each process, so one worker / num_proc=1 already uses both cores of a 2-core box.

    python bench/cache_build.py                  # about 2 minutes (gsm8k x5)
    python bench/cache_build.py --json /tmp/cache_build.json --repeat 10 --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # ../shared beside the checkout
GSM8K = DATA / "datasets" / "gsm8k_train.jsonl"
TOKENIZER = DATA / "tokenizers" / "gpt2_tokenizer.json"
HEADER = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request."
    "\n\n### Instruction:\n{instruction}\n\n### Response:\n"
)
VARIANTS = ("pitstop workers=2", "datasets num_proc=2", "pitstop workers=1", "datasets num_proc=1")


def run_pitstop(data: Path, workers: int, scratch: Path) -> tuple[int, int]:
    from pitstop.data import build_cache, open_cache

    cache = open_cache(build_cache(data, TOKENIZER, scratch / "cache", template="auto", workers=workers))
    return len(cache), int(cache.meta.tokens)


def run_datasets(data: Path, num_proc: int, scratch: Path) -> tuple[int, int]:
    import datasets
    from transformers import PreTrainedTokenizerFast

    datasets.disable_caching()
    datasets.disable_progress_bars()
    tok = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER))
    eos = "<|endoftext|>"

    def tokenize(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        prompts = tok([HEADER.format(instruction=q) for q in batch["question"]], add_special_tokens=False)
        answers = tok([a + eos for a in batch["answer"]], add_special_tokens=False)
        ids = [p + a for p, a in zip(prompts["input_ids"], answers["input_ids"], strict=True)]
        mask = [
            [0] * len(p) + [1] * len(a)
            for p, a in zip(prompts["input_ids"], answers["input_ids"], strict=True)
        ]
        return {"input_ids": ids, "completion_mask": mask}

    ds = datasets.Dataset.from_json(str(data), cache_dir=str(scratch / "hf"))
    ds = ds.map(
        tokenize, batched=True, num_proc=num_proc if num_proc > 1 else None, remove_columns=ds.column_names
    )
    return len(ds), int(sum(len(ids) for ids in ds["input_ids"]))  # counted after the clock stops


def one_run(variant: str, data: Path) -> dict[str, float]:
    """Time one variant in this process (called in a fresh subprocess per run); imports stay off the clock."""
    import datasets  # noqa: F401
    import transformers  # noqa: F401

    import pitstop.data.cache  # noqa: F401

    n = int(variant.rsplit("=", 1)[1])
    run = run_pitstop if variant.startswith("pitstop") else run_datasets
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        t0 = time.perf_counter()
        examples, tokens = run(data, n, Path(tmp))
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "examples": examples, "tokens": tokens}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="copies of gsm8k in the input file")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per variant (median)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one, args.data)))
        return 0
    missing = [str(p) for p in (GSM8K, TOKENIZER) if not p.is_file()]
    if missing:
        print(f"missing input data: {', '.join(missing)}", file=sys.stderr)
        return 2
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-gsm8k-") as tmp:
        data = Path(tmp) / "gsm8k_x.jsonl"
        text = GSM8K.read_text()
        data.write_text((text if text.endswith("\n") else text + "\n") * args.repeat)
        for _ in range(args.runs):
            for variant in VARIANTS:
                cmd = [sys.executable, __file__, "--one", variant, "--data", str(data)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                runs[variant].append(json.loads(out.strip().splitlines()[-1]))
    results: dict[str, dict[str, Any]] = {}
    for variant, values in runs.items():
        seconds = statistics.median(r["seconds"] for r in values)
        results[variant] = {"seconds": seconds, "runs": [r["seconds"] for r in values], "examples": values[0]["examples"],
                            "tokens": values[0]["tokens"], "examples_per_s": values[0]["examples"] / seconds,
                            "tokens_per_s": values[0]["tokens"] / seconds}  # fmt: skip
    first = results[VARIANTS[0]]
    print(
        f"input: gsm8k x{args.repeat} = {first['examples']:,} examples; median of {args.runs} runs per variant"
    )
    head = f"{'variant':20} {'median s':>9} {'examples/s':>11} {'tokens/s':>11} {'tokens':>11} {'vs datasets':>12}"
    print(head + "\n" + "-" * len(head))
    for variant, r in results.items():
        base = results[f"datasets num_proc={variant.rsplit('=', 1)[1]}"]
        r["ratio_vs_datasets"] = base["seconds"] / r["seconds"]
        print(
            f"{variant:20} {r['seconds']:9.2f} {r['examples_per_s']:11,.0f} {r['tokens_per_s']:11,.0f} "
            f"{r['tokens']:11,} {r['ratio_vs_datasets']:11.2f}x"
        )
    print("vs datasets: datasets median seconds / this variant's, same process count (>1 = faster)")
    if args.json:
        args.json.write_text(json.dumps({"repeat": args.repeat, "variants": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
