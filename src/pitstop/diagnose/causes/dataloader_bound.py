"""The step waiting on the input pipeline: data wait per step (live, or from a trace), utilization dips
between busy stretches in an nvidia-smi log, or a config with no workers; worth what the fix's workers hide."""

from __future__ import annotations

import statistics

from pitstop.core.findings import Finding, Use, use
from pitstop.core.vocabulary import CauseId, Device, Evidence, RemedyId, Severity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.diagnose.gpu_windows import active_samples, working
from pitstop.diagnose.metrics import rank_metrics
from pitstop.remedies import advise
from pitstop.remedies.workers import workers_for

DATA_WAIT_MIN = 0.05
DIP_UTIL = 20.0  # % utilization under which a busy GPU counts as waiting (nvidia-smi logs)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 2)


def _slowest_rank_wait(ctx: RuleContext) -> float | None:
    """Data wait of the rank that waits most: every rank waits for it, so its wait paces the job."""
    waits = [rank_metrics(r).data_wait_frac for r in ctx.profile.ranks if r.steps]
    known = [w for w in waits if w is not None]
    return max(known) if known else None


def _loader_uses(ctx: RuleContext, text_in_loop: bool) -> list[Use]:
    """Workers from the cores of the machine that ran the job (unknown for a log read elsewhere), and
    tokenizing once when examples reach the collate as text."""
    ranks = max(ctx.profile.world_size, 1)
    n = workers_for(ctx.env.cpu_count, ranks)
    basis = (
        f"{ctx.env.cpu_count} cores over {ranks} rank{'s' if ranks > 1 else ''}, one kept for each"
        if n
        else None
    )
    uses = [use(RemedyId.PRETOKENIZE)] if text_in_loop else []
    return [*uses, use(RemedyId.WORKERS, workers=n, basis=basis, pin=ctx.env.device != Device.CPU)]


def _with_workers(
    wait: float, have: int | None, workers: int | None, step_s: float | None
) -> tuple[float, str]:
    """The estimate with the fix's workers, and its basis. Workers load beside the step, each a batch in the
    time one loader takes now: the whole wait with no workers; with ``have`` of them bounding the step, ``have``
    steps. Batches then arrive every (that time) / ``workers``, and the step becomes the longer of that and
    the rest of the step. Without the fix's count (a log read elsewhere), or no more workers than now: hiding
    the whole wait, the bound."""
    measured = f"data wait is {wait:.1%} of step time (measured)"
    if workers is None or (have or 0) >= workers:
        return amdahl(wait, float("inf")), f"{measured}; hiding it fully gives at most 1/(1−f)"
    one_loader = wait if not have else float(have)  # one loader's time per batch, in steps of today
    step = max(1.0 - wait, one_loader / workers)

    def ms(x: float) -> str:
        return f"{x * step_s * 1000:.0f} ms" if step_s else f"{x:.0%} of a step"

    return 1.0 / max(step, 1e-9), (
        f"{measured}; with num_workers={workers} each worker loads a batch in the {ms(one_loader)} one loader "
        f"takes now, so one arrives every {ms(one_loader / workers)} against the {ms(1.0 - wait)} the rest of "
        "the step takes: the step becomes the longer of the two"
    )


@cause(
    CauseId.DATALOADER_BOUND,
    title="Input pipeline stalls the step",
    because=(
        "the accelerator waits on the CPU input pipeline (tokenizing on the fly, too few workers, no "
        "prefetch)"
    ),
    needs_gpu=False,
    needs=((Evidence.LOADER_TIMING, Evidence.SETTINGS),),
    fires_when=(
        "data wait ≥ {DATA_WAIT_MIN:.0%} of the step (of the rank that waits most); from an nvidia-smi "
        "log, utilization dips under {DIP_UTIL:.0f}% between busy stretches"
    ),
    estimate=(
        "with the fix's workers (the cores per rank, one kept for the step): each loads a batch in the "
        "time one loader takes now, so a batch arrives every (that time) / workers, and the step becomes "
        "the longer of that and the rest of the step; without the count, at most 1/(1 − data wait share)"
    ),
    remedies=(RemedyId.PRETOKENIZE, RemedyId.WORKERS),
)
def dataloader_bound(ctx: RuleContext) -> Finding | None:
    f = _slowest_rank_wait(ctx)
    if f is None:
        return _dips_in_log(ctx) or _workers_in_config(ctx)
    if f < DATA_WAIT_MIN:
        return None
    m = ctx.metrics
    dl = ctx.env.dataloader
    text_in_loop = bool(dl.examples_are_text)
    evidence: dict[str, object] = {
        "data_wait_frac": round(f, 3),
        "data_wait_ms_per_step": _ms(f * m.step_time_s) if m.step_time_s else None,
        "num_workers": dl.num_workers,
        "pin_memory": dl.pin_memory,
        "persistent_workers": dl.persistent_workers,
        "examples_are_text": dl.examples_are_text,
        "collate_ms_per_batch": _ms(dl.collate_s_per_batch),
        "main_process_cpu_pct": None if m.main_cpu_pct is None else round(m.main_cpu_pct, 1),
    }
    multiprocess = [t.dataloader_multiprocess for t in ctx.traces if t.dataloader_multiprocess is not None]
    if multiprocess:
        evidence["multiprocess_iterator"] = all(multiprocess)
    if len(ctx.profile.ranks) > 1:
        evidence["data_wait_frac_mean_over_ranks"] = (
            None if m.data_wait_frac is None else round(m.data_wait_frac, 3)
        )
    causes = []
    if text_in_loop:
        causes.append("examples are tokenized inside the collate function on every step")
    if dl.num_workers == 0 or (multiprocess and not any(multiprocess)):
        causes.append("the DataLoader has no worker processes (num_workers=0), so loading blocks the step")
    who = " on the rank that waits most" if len(ctx.profile.ranks) > 1 else ""
    summary = f"The step waits on the input pipeline {f:.0%} of the time{who}"
    summary += (": " + "; ".join(causes) + ".") if causes else "."
    if ctx.env.device == Device.CPU:
        summary += " (On a CPU run, workers share cores with compute; pre-tokenizing helps regardless.)"
    uses = _loader_uses(ctx, text_in_loop)
    workers = next((u.params.get("workers") for u in uses if u.remedy is RemedyId.WORKERS), None)
    est, basis = _with_workers(f, dl.num_workers, workers, m.step_time_s)
    return Finding(
        cause=CauseId.DATALOADER_BOUND,
        severity=severity_for(f, 0.20, 0.10),
        confidence=0.9,
        summary=summary,
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis.replace("(measured)", "(measured, slowest rank)") if who else basis,
        fix=advise(ctx.framework, *uses),
    )


def _dips_in_log(ctx: RuleContext) -> Finding | None:
    """nvidia-smi: a busy GPU that keeps dropping to idle is waiting between steps."""
    best: tuple[float, int, float] | None = None
    for window in working(ctx.results.gpus):  # pauses of the job are not dips between steps
        rank = next(r for r in ctx.profile.ranks if r.rank == window.gpu)
        utils = [s.util for s in active_samples(rank, window) if s.util is not None]
        if len(utils) < 20:
            continue
        # ignore the idle head and tail (start-up, shutdown): the busy period is first to last busy sample
        busy = [i for i, u in enumerate(utils) if u >= 50]
        if len(busy) < 10:
            continue
        body = utils[busy[0] : busy[-1] + 1]
        dips = [u < DIP_UTIL for u in body]
        share = sum(dips) / len(body)
        runs = sum(1 for i, d in enumerate(dips) if d and (i == 0 or not dips[i - 1]))
        if best is None or share > best[0]:
            best = (share, runs, statistics.fmean(body))
    if best is None or best[0] < 0.05 or best[1] < 3:
        return None
    share, runs, mean_util = best
    return Finding(
        cause=CauseId.DATALOADER_BOUND,
        severity=Severity.MEDIUM if share >= 0.15 else Severity.LOW,
        confidence=0.35,
        summary=(
            f"The GPU keeps dropping to idle while the job runs ({runs} dips, {share:.0%} of the busy period "
            "below 20% utilization): the pattern of steps waiting on the input pipeline, a host sync or "
            "checkpoints. A trace or `pitstop doctor` tells which."
        ),
        evidence={
            "idle_share_while_running": round(share, 3),
            "dips": runs,
            "mean_util_pct": round(mean_util, 1),
        },
        est_speedup=amdahl(share, float("inf")),
        speedup_basis="nvidia-smi samples: removing the idle dips gives at most 1/(1−share)",
        fix=advise(ctx.framework, *_loader_uses(ctx, False)),
    )


def _workers_in_config(ctx: RuleContext) -> Finding | None:
    if ctx.env.dataloader.num_workers != 0 or ctx.measured:
        return None
    return Finding(
        cause=CauseId.DATALOADER_BOUND,
        severity=Severity.LOW,
        confidence=0.3,
        summary="The config loads batches in the training process (dataloader_num_workers=0): any per-batch "
        "work (collation, on-the-fly tokenization) will stall the GPU.",
        evidence={"num_workers": 0, "sources": ctx.env.config_sources[:3]},
        est_speedup=None,
        speedup_basis="config only: measure with `pitstop doctor` to put a number on it",
        fix=advise(ctx.framework, *_loader_uses(ctx, False)),
    )
