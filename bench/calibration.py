"""Calibration: does each rule's estimated speed-up hold up when ``pitstop tune`` measures the fix?

Planted-cause CPU jobs (``bench/calibration_job.py``: padding at several shares, a slow loader at several
delays, eager attention at two lengths, activation checkpointing on a model that fits, oversubscribed threads;
a Trainer that saves every other step; ``bench/calibration_ddp.py``: a straggler rank and a communication-heavy
two-rank DDP job; ``tests/scripts/gc_heavy.py``: a loop whose full garbage collections traverse ~3 M live
objects). Each runs under ``pitstop tune --only <the cause's fixes>``: tune's first window is the
doctor's diagnosis (the same rules on the same probe), so its findings give the estimate, and the fix windows
the measurement. A fix tune cannot apply from outside the job (balancing the ranks, ``no_sync``) is applied by
the job's own flag instead and measured by ``pitstop doctor`` on both jobs, alternated (A B A B). Per case: the planted
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
DDP_JOB = str(Path(__file__).with_name("calibration_ddp.py"))
GC_JOB = str(Path(__file__).parents[1] / "tests" / "scripts" / "gc_heavy.py")
TORCHRUN = ("-m", "torch.distributed.run", "--nproc_per_node", "2")
CORES = len(os.sched_getaffinity(0))
BALANCED = (*TORCHRUN, DDP_JOB, "--width", "512", "--batch", "2", "--seq", "8")  # two ranks, same work
# large gradients, little compute: every micro-batch all-reduces 42 MB
ACCUM_4 = (
    *TORCHRUN,
    DDP_JOB,
    "--width",
    "2048",
    "--depth",
    "2",
    "--batch",
    "1",
    "--seq",
    "4",
    "--accum",
    "4",
)
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
    fixed: tuple[str, ...] = ()  # the job with the fix applied by its own flag (fixes tune cannot apply)
    env: tuple[tuple[str, str], ...] = ()  # the job's environment, beside this process's
    steps: int = 16  # steps in each doctor window of a fix measured by hand (many, where pauses are rare)

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
        (JOB, "--attn", "eager", "--len-lo", "128", "--len-hi", "128"),
    ),
    Case(
        "eager-384",
        "slow_attention",
        ("attention",),
        (JOB, "--attn", "eager", "--len-lo", "384", "--len-hi", "384"),
    ),
    Case(
        "checkpointing",
        "needless_recompute",
        ("no_checkpointing",),
        (JOB, "--checkpointing", "--hidden", "128", "--layers", "4", *FIXED),
    ),
    Case(
        "threads-4x",
        "cpu_oversubscribed",
        ("cpu_threads",),
        (JOB, "--threads", str(4 * CORES), *FIXED),  # four torch threads per core the job may use
    ),
    Case(
        "saves-every-2",
        "checkpoint_stall",
        ("save_less_often",),
        (TRL_JOB, "--save-steps", "2", "--batch", "1", "--steps", "100000"),
        env=(("OMP_NUM_THREADS", "1"),),
    ),
    Case(
        "straggler-100ms",
        "straggler",
        ("balance_ranks",),
        (*BALANCED, "--slow-rank", "1", "--slow-ms", "100"),
        fixed=BALANCED,
    ),
    Case(  # the same delay spent computing: on a CPU the sleeping straggler leaves its core to the other rank
        "straggler-busy-100ms",
        "straggler",
        ("balance_ranks",),
        (*BALANCED, "--slow-rank", "1", "--slow-ms", "100", "--busy"),
        fixed=BALANCED,
    ),
    Case(
        "ddp-accum-4",
        "communication_bound",
        ("no_sync_accumulation",),
        (*ACCUM_4,),
        fixed=(*ACCUM_4, "--no-sync"),
    ),
    Case(
        "gc-3M",
        "gc_pauses",
        ("manual_gc",),
        (GC_JOB, "--steps", "100000"),
        fixed=(GC_JOB, "--steps", "100000", "--manual-gc"),  # tune does not apply manual_gc
        steps=60,  # a full collection every ~5 steps either way: 16 steps would hold 3 or 4 of them
    ),
    Case(
        "gc-1M",
        "gc_pauses",
        ("manual_gc",),
        (GC_JOB, "--steps", "100000", "--objects", "1000000"),
        fixed=(GC_JOB, "--steps", "100000", "--objects", "1000000", "--manual-gc"),
        steps=60,  # fewer survivors against the same garbage: the found objects' share of a collection grows
    ),
    Case(  # eight metrics all-reduced and read back (.item()) every step; fixed: summed locally, reduced every 50
        "metric-sync-8",
        "metric_sync",
        ("sync_metrics_less",),
        (*TORCHRUN, str(Path(__file__).parents[1] / "tests" / "scripts" / "metric_sync_loop.py")),
        fixed=(
            *TORCHRUN,
            str(Path(__file__).parents[1] / "tests" / "scripts" / "metric_sync_loop.py"),
            "--every",
            "50",
        ),
    ),
    Case(  # a Trainer on two ranks, 4 micro-batches a step, include_num_input_tokens_seen=True: tune switches it off
        "tokens-seen-accum-4",
        "metric_sync",
        ("sync_metrics_less",),
        (*TORCHRUN, str(Path(__file__).parents[1] / "tests" / "scripts" / "trainer_tokens_seen.py")),
        env=(("OMP_NUM_THREADS", "1"),),
    ),
    Case(  # DDP(find_unused_parameters=True) on 96 small blocks, every parameter used: tune switches it off
        "ddp-find-unused",
        "ddp_find_unused",
        ("no_unused_search",),
        (*TORCHRUN, str(Path(__file__).parents[1] / "tests" / "scripts" / "ddp_unused.py")),
    ),
    Case(  # Lightning DDP logging 4 values with self.log(..., sync_dist=True) every step; fixed: sync_dist=False
        "lightning-sync-dist-4",
        "metric_sync",
        ("sync_metrics_less",),
        (*TORCHRUN, str(Path(__file__).parents[1] / "tests" / "scripts" / "lightning_sync_dist.py")),
        fixed=(
            *TORCHRUN,
            str(Path(__file__).parents[1] / "tests" / "scripts" / "lightning_sync_dist.py"),
            "--no-sync",
        ),
    ),
    Case(  # gc.collect() + empty_cache() after every step of a plain loop, ~0.4 M live objects: tune thins them
        "cleanup-loop",
        "per_step_cleanup",
        ("no_per_step_cleanup",),
        (
            str(Path(__file__).parents[1] / "tests" / "scripts" / "cleanup_loop.py"),
            *("--steps", "100000", "--objects", "0", "--hidden", "256", "--layers", "4"),
        ),
    ),
    Case(  # a Trainer's TrainerCallback.on_step_end collects and empties the cache, ~0.4 M live objects
        "cleanup-trainer",
        "per_step_cleanup",
        ("no_per_step_cleanup",),
        (
            str(Path(__file__).parents[1] / "tests" / "scripts" / "cleanup_trainer.py"),
            *("--steps", "100000", "--objects", "0", "--hidden", "256", "--layers", "4", "--batch", "8"),
        ),
        env=(("OMP_NUM_THREADS", "1"),),
    ),
    Case(  # torch.compile(dynamic=False) on a length curriculum: one token longer every 8 steps, the limit raised
        "recompiles-every-8",
        "recompiles",
        ("dynamic_compile", "length_buckets"),
        (
            str(Path(__file__).parents[1] / "tests" / "scripts" / "compiled_loop.py"),
            *("--grow-every", "8", "--grow-by", "1", "--start-len", "96", "--recompile-limit", "1000"),
        ),
        env=(("OMP_NUM_THREADS", "1"),),  # one thread: a busy core does not stall a parallel region 10×
    ),
    Case(  # a LoRA tiny Llama on two FSDP ranks, checkpoint_wrapper(REENTRANT) around each unit: 13 all-gathers a step, not 9
        "reentrant-fsdp",
        "reentrant_checkpointing",
        ("non_reentrant_checkpointing",),
        (*TORCHRUN, str(Path(__file__).parents[1] / "tests" / "scripts" / "reentrant_fsdp.py")),
    ),
    Case(  # autograd's anomaly detection switched on before the loop: tune keeps it off in the trial
        "anomaly",
        "debug_modes",
        ("debug_off",),
        (str(Path(__file__).parents[1] / "tests" / "scripts" / "anomaly_loop.py"), "--steps", "100000"),
    ),
    Case(  # 64 small blocks, each its own FSDP2 unit, on two gloo ranks: 194 collectives a step; the twin is DDP
        "fsdp-small-tensors",
        "sharding_overhead",
        ("plain_ddp",),
        (*TORCHRUN, str(Path(__file__).parents[1] / "tests" / "scripts" / "fsdp_small_tensors.py")),
        fixed=(
            *TORCHRUN,
            str(Path(__file__).parents[1] / "tests" / "scripts" / "fsdp_small_tensors.py"),
            *("--wrap", "ddp"),
        ),
        env=(("OMP_NUM_THREADS", "1"),),
    ),
    Case(  # a QLoRA loop: BitsAndBytesConfig 4-bit NF4 base + LoRA, 64 tokens a step; the twin loads it dense
        "qlora-4bit",
        "quantized_base",
        ("bf16_lora",),
        (str(Path(__file__).parents[1] / "tests" / "scripts" / "qlora_loop.py"), "--steps", "100000"),
        fixed=(
            str(Path(__file__).parents[1] / "tests" / "scripts" / "qlora_loop.py"),
            *("--steps", "100000", "--base", "dense"),
        ),
    ),
    Case(  # a tiny Transformers Mixtral (32 experts, top-2) loaded with experts_implementation="eager"
        "moe-eager-32",
        "moe_experts_loop",
        ("grouped_experts",),
        (
            str(Path(__file__).parents[1] / "tests" / "scripts" / "moe_eager.py"),
            *("--experts", "eager", "--steps", "100000"),
        ),
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


def measure(case: Case, budget_s: int) -> dict[str, Any]:
    """Tune's document for the case, or one of the same shape from doctor runs of the job and its fixed twin."""
    return by_hand(case) if case.fixed else tune(case, budget_s)


def tune(case: Case, budget_s: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "tune.json"
        cmd = [
            sys.executable, "-m", "pitstop", "tune", "--no-history", "--json", str(out),
            "--budget", f"{budget_s}s", "--only", ",".join(case.all_fixes),
            "--", sys.executable, *case.job,
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **dict(case.env)})
        if not out.exists():
            raise RuntimeError(f"{case.name}: tune wrote nothing: {proc.stderr.strip().splitlines()[-1:]}")
        return json.loads(out.read_text())


def doctor(case: Case, job: tuple[str, ...], warmup: int = 3, steps: int = 16) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [
            sys.executable, "-m", "pitstop", "doctor", "--quiet", "--no-history", "--json", str(out),
            "--warmup", str(warmup), "--steps", str(steps), "--", sys.executable, *job,
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **dict(case.env)})
        if not out.exists():
            raise RuntimeError(f"{case.name}: doctor wrote nothing: {proc.stderr.strip().splitlines()[-1:]}")
        return json.loads(out.read_text())


RESOLVES = 0.03  # the smallest effect taken as measured (tune's floor)


def mean_step_s(run: dict[str, Any]) -> float:
    """Rank 0's mean step time in the window: the pace the job trains at. Not the median (the report's
    ``step_time_s``), which leaves out the steps a pause lands in: a collection or a save every few steps."""
    return statistics.fmean(s["wall_s"] for s in run["profile"]["ranks"][0]["steps"])


def by_hand(case: Case) -> dict[str, Any]:
    """The job (A) and its fixed twin (B) under doctor, A B A B: the speed-up is the ratio of the mean step
    times; the two A runs' disagreement is the noise. Kept / slower past twice the noise (and 3%); within
    noise when the A runs agree within 3%, else undecided (the machine could not resolve the effect)."""
    runs = [doctor(case, job, steps=case.steps) for job in (case.job, case.fixed, case.job, case.fixed)]
    a = [mean_step_s(r) for r in runs[0::2]]
    b = [mean_step_s(r) for r in runs[1::2]]
    speedup = statistics.fmean(a) / statistics.fmean(b)
    spread = abs(a[0] - a[1]) / statistics.fmean(a)
    bar = max(RESOLVES, 2 * spread)
    status = (
        "kept"
        if speedup >= 1 + bar
        else "slower"
        if speedup <= 1 - bar
        else "within noise"
        if spread <= RESOLVES
        else "undecided"
    )
    fix = case.fixes[0]
    return {
        "baseline_run": runs[0],
        "candidates": [{"fix": fix, "status": status, "speedup": speedup, "spread": spread}],
        "baseline": {"real_tokens_per_s": runs[0]["metrics"].get("real_tokens_per_s")},
        "undecided": [fix] if status == "undecided" else None,
        "measured_by": "doctor: the job and its twin with the fix applied by its own flag, A B A B",
    }


def before_estimate(
    cause: str, metrics: dict[str, Any], evidence: dict[str, Any] | None = None
) -> float | None:
    """What the rule estimated before issue 27, from the same window: needless_recompute took the whole
    forward share; padding_waste took forward + backward + optimizer as the share that scales with tokens;
    communication_bound took the exposed share (blocked after the last rank arrived) whatever the fix;
    gc_pauses took the full collections' whole time; dataloader_bound took hiding the whole data wait; slow_attention took eager attention as 2× slower per FLOP
    on a CPU (3× on a GPU) over the attention's share of the FLOPs."""
    exposed = (evidence or {}).get("exposed_frac_of_step")
    full = (evidence or {}).get("gen2_frac")
    wait = (evidence or {}).get("data_wait_frac")
    if cause == "dataloader_bound" and isinstance(wait, float) and wait < 1:
        return 1 / (1 - wait)
    if cause == "gc_pauses" and isinstance(full, float) and full < 1:
        return 1 / (1 - full)
    if cause == "communication_bound" and isinstance(exposed, float) and exposed < 1:
        return 1 / (1 - exposed)
    fwd, bwd, opt = metrics.get("forward_frac"), metrics.get("backward_frac"), metrics.get("optimizer_frac")
    attention = (evidence or {}).get("attention_flops_frac")
    if cause == "slow_attention" and isinstance(attention, float) and None not in (fwd, bwd, opt):
        compute = min(1.0, fwd + bwd + opt)
        return 1 / (1 - compute * (1 - 1 / (1 - attention + 2 * attention)))
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
        "before": before_estimate(cause, run["metrics"], planted["evidence"] if planted else None),
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
        doc = measure(case, args.budget)
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
