"""Calibration: does each rule's estimated speed-up hold up when ``pitstop tune`` measures the fix?

Planted-cause CPU jobs (``bench/calibration_job.py``: padding at several shares, a slow loader at several
delays, eager attention at two lengths, activation checkpointing on a model that fits). Each runs under
``pitstop tune --only <the cause's fixes>``: tune's first window is the doctor's diagnosis (the same rules on the
same probe), so its findings give the estimate, and the fix windows the measurement. Per case: the planted
cause's estimate, the best measured speed-up of its fixes (those that keep the computation), their ratio, and
the estimate the rule gave before issue 27 (``before``, recomputed from the same window's step split). Then the
median |log(estimate / measured)| per cause, and whether the top-ranked finding's fix measured within noise
while another fix measured ≥ ×1.15.

    python bench/calibration.py                      # every case, ~2 min each on a 2-core CPU
    python bench/calibration.py --cases padding-256 --budget 90
    python bench/calibration.py --json calibration.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JOB = str(Path(__file__).with_name("calibration_job.py"))
TRL_JOB = str(Path(__file__).resolve().parents[1] / "tests" / "scripts" / "hf_trainer.py")
FIXED = ["--len-lo", "96", "--len-hi", "96"]  # every example 96 tokens: no padding to muddle other causes


@dataclass(frozen=True)
class Case:
    name: str
    cause: str
    fixes: tuple[str, ...]  # what tune measures for it (fixes that keep the computation)
    job: tuple[str, ...]  # the job's arguments (after ``python``)
    also: tuple[
        tuple[str, tuple[str, ...]], ...
    ] = ()  # more planted causes of the same job, with their fixes

    @property
    def causes(self) -> list[tuple[str, tuple[str, ...]]]:
        return [(self.cause, self.fixes), *self.also]

    @property
    def all_fixes(self) -> list[str]:
        return list(dict.fromkeys(f for _, fixes in self.causes for f in fixes))


CASES = [
    Case("padding-256", "padding_waste", ("trim_padding", "pack_batch"), (JOB, "--pad-to", "256")),
    Case("padding-160", "padding_waste", ("trim_padding", "pack_batch"), (JOB, "--pad-to", "160")),
    Case("padding-longest", "padding_waste", ("pack_batch",), (JOB,)),
    Case("loader-2ms", "dataloader_bound", ("workers",), (JOB, "--slow-ms", "2", *FIXED)),
    Case("loader-6ms", "dataloader_bound", ("workers",), (JOB, "--slow-ms", "6", *FIXED)),
    Case(
        "eager-128",
        "slow_attention",
        ("attention",),
        ("--attn", "eager", "--len-lo", "128", "--len-hi", "128"),
    ),
    Case(
        "eager-384",
        "slow_attention",
        ("attention",),
        ("--attn", "eager", "--len-lo", "384", "--len-hi", "384"),
    ),
    Case(
        "checkpointing",
        "needless_recompute",
        ("no_checkpointing",),
        (JOB, "--checkpointing", "--hidden", "128", "--layers", "4", *FIXED),
    ),
    # the held-out kind of job: TRL's SFTTrainer with its defaults (checkpointing on), unpacked data
    # padded to each batch's longest, a small Llama on CPU
    Case(
        "trl-sft-defaults",
        "padding_waste",
        ("pack_batch",),
        (TRL_JOB, "--trl", "--steps", "100000"),
        also=(("needless_recompute", ("no_checkpointing",)),),
    ),
]
MEASURED = {"kept", "within noise", "slower", "undecided"}
DECIDED = {"kept", "within noise", "slower"}


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "–"


def tune(case: Case, budget_s: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "tune.json"
        cmd = [
            sys.executable, "-m", "pitstop", "tune", "--no-history", "--json", str(out),
            "--budget", f"{budget_s}s", "--only", ",".join(case.all_fixes),
            "--", sys.executable, *case.job,
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if not out.exists():
            raise RuntimeError(f"{case.name}: tune wrote nothing: {proc.stderr.strip().splitlines()[-1:]}")
        return json.loads(out.read_text())


def before_estimate(cause: str, metrics: dict[str, Any]) -> float | None:
    """What the rule estimated before issue 27, from the same window: needless_recompute took the whole
    forward share; padding_waste took forward + backward + optimizer as the share that scales with tokens."""
    fwd, bwd, opt = metrics.get("forward_frac"), metrics.get("backward_frac"), metrics.get("optimizer_frac")
    if cause == "needless_recompute" and fwd is not None:
        return 1 / (1 - fwd)
    if cause == "padding_waste" and None not in (fwd, bwd, opt, metrics.get("padding_frac")):
        return 1 / (1 - min(1.0, fwd + bwd + opt) * metrics["padding_frac"])
    return None


def rows_of(case: Case, doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [row_of(case.name, cause, fixes, doc) for cause, fixes in case.causes]


def row_of(name: str, cause: str, fixes: tuple[str, ...], doc: dict[str, Any]) -> dict[str, Any]:
    run = doc["baseline_run"]
    findings = run["findings"]
    planted = next((f for f in findings if f["cause"] == cause), None)
    measured = [
        c for c in doc["candidates"] if c["fix"] in fixes and c["status"] in MEASURED and c["speedup"]
    ]
    best = max(measured, key=lambda c: c["speedup"], default=None)
    est = planted["est_speedup"] if planted else None
    top = findings[0]["cause"] if findings else None
    return {
        "case": name,
        "cause": cause,
        "found": planted is not None,
        "rank": None if planted is None else findings.index(planted) + 1,
        "top": top,
        "estimate": est,
        "before": before_estimate(cause, run["metrics"]),
        "measured": None if best is None else best["speedup"],
        "measured_fix": None if best is None else best["fix"],
        "status": None if best is None else best["status"],
        "spread": None if best is None else best["spread"],
        "statuses": {c["fix"]: c["status"] for c in doc["candidates"] if c["fix"] in fixes},
        "baseline_rate": doc["baseline"]["real_tokens_per_s"],
        "undecided": doc.get("undecided"),
    }


def log_error(est: float | None, measured: float | None) -> float | None:
    return None if not est or not measured else abs(math.log(est / measured))


def table(rows: list[dict[str, Any]]) -> str:
    def num(v: float | None) -> str:
        return "–" if v is None else f"×{v:.2f}"

    lines = [
        "| case | cause | rank | estimate | before | measured (fix, verdict) | est/measured | before/measured |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ratio = "–" if not r["estimate"] or not r["measured"] else f"{r['estimate'] / r['measured']:.2f}"
        old = "–" if not r["before"] or not r["measured"] else f"{r['before'] / r['measured']:.2f}"
        what = (
            f"{num(r['measured'])} ±{r['spread'] or 0:.0%} ({r['measured_fix']}, {r['status']})"
            if r["measured"]
            else "–"
        )
        lines.append(
            f"| {r['case']} | {r['cause']} | {r['rank'] or 'not found'} | {num(r['estimate'])} | "
            f"{num(r['before'])} | {what} | {ratio} | {old} |"
        )
    lines += [
        "",
        "| cause | cases | decided | median abs(log(est/measured)) | before |",
        "| --- | --- | --- | --- | --- |",
    ]
    for cause in dict.fromkeys(r["cause"] for r in rows):
        mine = [r for r in rows if r["cause"] == cause]
        decided = [r for r in mine if r["status"] in DECIDED]  # an undecided figure calibrates nothing
        now = [e for e in (log_error(r["estimate"], r["measured"]) for r in decided) if e is not None]
        old = [e for e in (log_error(r["before"], r["measured"]) for r in decided) if e is not None]
        lines.append(f"| {cause} | {len(mine)} | {len(decided)} | {_median(now)} | {_median(old)} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--budget", type=int, default=150, help="seconds of tune per case")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="write each case's tune document here")
    parser.add_argument(
        "--rows", type=Path, nargs="*", default=[], help="print the table of saved --json rows"
    )
    args = parser.parse_args()
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [w for w in wanted if w not in {c.name for c in CASES}]
    if unknown:
        print(f"unknown case {unknown[0]!r}; known: {', '.join(c.name for c in CASES)}", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = [r for path in args.rows for r in json.loads(path.read_text())]
    if args.rows:
        print(table(rows))
        return 0
    for case in [c for c in CASES if not wanted or c.name in wanted]:
        started = time.monotonic()
        doc = tune(case, args.budget)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            (args.keep / f"{case.name}.json").write_text(json.dumps(doc))
        for row in rows_of(case, doc):
            row["seconds"] = round(time.monotonic() - started)
            row["load"] = round(os.getloadavg()[0], 1)  # the machine's 1-minute load average after the case
            rows.append(row)
            print(
                f"{case.name} / {row['cause']}: rank {row['rank']} (top {row['top']}), estimate {row['estimate']}, "
                f"before {row['before']}, measured {row['measured']} ({row['statuses']}, {row['seconds']} s, "
                f"load {row['load']})",
                flush=True,
            )
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
