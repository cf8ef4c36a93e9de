"""A batch too small to fill the GPU: utilization (or SM activity) low while the job computes, with memory
headroom the planner can size a larger micro-batch into."""

from __future__ import annotations

from pitstop.core.findings import Finding, Use, use
from pitstop.core.vocabulary import CauseId, RemedyId
from pitstop.diagnose.activity import Activity, read_activity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, severity_for
from pitstop.diagnose.gpu_windows import working
from pitstop.plan.from_run import has_shape, setup_for_run
from pitstop.plan.memory import GIB
from pitstop.plan.planner import largest_micro_batch
from pitstop.remedies import advise
from pitstop.remedies.micro_batch import next_micro_batch

SM_FULL = 0.8  # SM activity a well-filled GPU reaches (est. target for small_batch from the counters)
OCC_FULL = 0.5  # occupancy both counters agree below, with SM activity under SM_FULL


def _busy_while_computing(ctx: RuleContext) -> tuple[float | None, dict[str, object], str]:
    """The GPU busy share small_batch judges by, its evidence, and the words for it.

    From GPU samples: per GPU, over the job's active time only (gpu_windows.py), averaged over the GPUs
    that worked; a GPU that never worked is idle_gpu's and a pause of the job is not an under-filled
    batch. From a trace alone: the trace's kernel-busy share of the step."""
    m = ctx.metrics
    windows = working(ctx.results.gpus)
    if m.source_of_util not in ("nvml", "nvidia-smi"):
        return m.gpu_util, {}, "of the time"
    evidence: dict[str, object] = {
        "gpu_util_active": None if m.gpu_util_active is None else round(m.gpu_util_active, 3),
        "gpu_active_frac": None if m.gpu_active_frac is None else round(m.gpu_active_frac, 3),
        "gpu_util_active_per_gpu": {
            str(w.gpu): round(w.active_util, 3) for w in windows if w.active_util is not None
        },
        "idle_gpus_left_out": [w.gpu for w in ctx.results.gpus if w.never_busy],
    }
    whole = m.gpu_active_frac is not None and m.gpu_active_frac >= 0.995
    when = "of the time" if whole else "while the job computes"
    if len(windows) > 1:
        when += f" (mean of GPUs {', '.join(str(w.gpu) for w in windows)})"
    return m.gpu_util_active, evidence, when


@cause(
    CauseId.SMALL_BATCH,
    title="Batch too small to fill the GPU",
    because="the batch is too small to fill the GPU; per-step overhead dominates",
    needs_gpu=True,
    fires_when=(
        "utilization < 75% while the job computes (per GPU, mean over the GPUs that worked; a trace's "
        "kernel-busy share without samples), memory headroom, not explained by data wait; or SM activity "
        "under {SM_FULL:.0%} from the activity counters"
    ),
    estimate="at most 1/utilization",
    remedies=(RemedyId.MICRO_BATCH,),
)
def small_batch(ctx: RuleContext) -> Finding | None:
    if not ctx.on_gpu:
        return None
    m = ctx.metrics
    util, active_evidence, when = _busy_while_computing(ctx)
    act = read_activity(ctx.profile)
    starved = act is not None and act.starved
    if util is None or util >= 0.75:
        if not starved or act is None:
            return None
        return _small_batch_counted(ctx, util, act)
    if (m.data_wait_frac or 0.0) >= 0.15:
        return None  # the idle time is the input pipeline's; dataloader_bound explains it
    mem = m.gpu_mem_used_frac
    if mem is not None and mem > 0.85:
        return None  # no room for a bigger batch
    launch_bound = any(t.launch_bound for t in ctx.traces)
    tiny = ctx.trace_mean(lambda t: t.tiny_kernel_frac)
    est = min(1.0 / max(util, 0.05), 4.0)
    evidence: dict[str, object] = {
        "gpu_util": None if m.gpu_util is None else round(m.gpu_util, 3),  # whole-window mean, as before
        "util_source": m.source_of_util,
        "gpu_mem_used_frac": None if mem is None else round(mem, 3),
        "micro_batch_size": ctx.env.micro_batch_size,
        "grad_accum_steps": ctx.env.grad_accum_steps,
        "tokens_per_micro_batch": None
        if m.tokens_per_micro_batch is None
        else round(m.tokens_per_micro_batch),
        **active_evidence,
    }
    if tiny is not None:
        evidence["tiny_kernel_frac"] = round(tiny, 3)
        evidence["launch_bound"] = launch_bound
    planned = planned_micro_batch(ctx)
    if planned is not None:
        evidence["plan_max_micro_batch"] = planned
        if planned <= (ctx.env.micro_batch_size or 1):
            return (
                None  # the planner says a bigger micro-batch would not fit: the idle time has another cause
            )
    confidence = 0.7 if mem is not None or ctx.traces else 0.5
    if m.source_of_util == "nvidia-smi" and m.data_wait_frac is None:
        confidence = 0.4  # a log cannot tell a small batch from a slow input pipeline
    if starved and act is not None:  # the counters agree: the SMs are mostly empty too
        confidence = min(0.9, confidence + 0.15)
        evidence.update(act.evidence())
    detail = (
        f" with {m.tokens_per_micro_batch:.0f} tokens per micro-batch" if m.tokens_per_micro_batch else ""
    )
    if launch_bound:
        detail += " and most kernels shorter than 10 µs (launch-bound)"
    return Finding(
        cause=CauseId.SMALL_BATCH,
        severity=severity_for(1 - util, 0.6, 0.35),
        confidence=confidence,
        summary=(
            f"The GPU is busy only {util:.0%} {when}{detail}"
            + (f" and has {1 - mem:.0%} of its memory free" if mem is not None else "")
            + ": the work per step is too small to fill it."
        ),
        evidence=evidence,
        est_speedup=est,
        speedup_basis=f"GPU busy share {when} ({m.source_of_util}, measured); filling the idle share gives at "
        "most 1/util (capped at 4×)",
        fix=advise(ctx.framework, micro_batch_use(ctx, planned)),
    )


def _small_batch_counted(ctx: RuleContext, util: float | None, act: Activity) -> Finding | None:
    """Utilization reads high (or was not logged) but the SMs are mostly empty: kernels too small to fill
    the GPU, which utilization cannot show (one small kernel at a time reads 100 %)."""
    m = ctx.metrics
    if (m.data_wait_frac or 0.0) >= 0.15:
        return None
    mem = m.gpu_mem_used_frac
    if mem is not None and mem > 0.85:
        return None  # no room for a bigger batch
    planned = planned_micro_batch(ctx)
    if planned is not None and planned <= (ctx.env.micro_batch_size or 1):
        return None
    sm, occ = act.get("sm_active"), act.get("sm_occupancy")
    fill = sm if sm is not None else (occ or 0.0) / OCC_FULL
    evidence: dict[str, object] = {
        "gpu_util": None if util is None else round(util, 3),
        "util_source": m.source_of_util,
        "gpu_mem_used_frac": None if mem is None else round(mem, 3),
        "micro_batch_size": ctx.env.micro_batch_size,
        "plan_max_micro_batch": planned,
        **act.evidence(),
    }
    launch_bound = any(t.launch_bound for t in ctx.traces)
    agree = launch_bound or (sm is not None and occ is not None and sm < SM_FULL and occ < OCC_FULL)
    reads = f"Utilization reads {util:.0%}, but " if util is not None else ""
    return Finding(
        cause=CauseId.SMALL_BATCH,
        severity=severity_for(1 - fill, 0.6, 0.35),
        confidence=0.75 if agree else 0.6,
        summary=(
            f"{reads}the hardware counters show the SMs mostly empty ({act.words()}): the kernels are too "
            "small to fill the GPU, which utilization (some kernel running) cannot show."
        ),
        evidence=evidence,
        est_speedup=min(SM_FULL / max(fill, 0.05), 4.0) if fill < SM_FULL else None,
        speedup_basis=f"SM activity {fill:.0%} (measured) raised toward {SM_FULL:.0%} by more work per kernel; "
        "capped at 4×",
        fix=advise(ctx.framework, micro_batch_use(ctx, planned)),
    )


def planned_micro_batch(ctx: RuleContext) -> int | None:
    """The largest micro-batch `pitstop plan` predicts for this run's model, sequence length and GPU, or None
    when the run did not reveal enough of them."""
    seq = ctx.metrics.seq_len or ctx.env.max_seq_len
    gpu_bytes = ctx.env.gpu_memory_bytes or (ctx.gpu.memory_gib * GIB if ctx.gpu else None)
    setup = setup_for_run(ctx.env, seq=round(seq or 0), gpus=ctx.profile.world_size)
    if setup is None or not has_shape(setup) or not gpu_bytes:
        return None
    return largest_micro_batch(setup, gpu_bytes)


def micro_batch_use(ctx: RuleContext, planned: int | None) -> Use:
    """The micro-batch to move to, from the planner when it knows the model and GPU; without today's
    micro-batch no number is made up."""
    micro, accum = ctx.env.micro_batch_size, ctx.env.grad_accum_steps
    if not micro:
        basis = f"`pitstop plan` predicts up to {planned} fits" if planned else None
        return use(RemedyId.MICRO_BATCH, planned=planned, basis=basis)
    step = next_micro_batch(micro, accum or 1, planned)
    if step is None:
        return use(RemedyId.MICRO_BATCH, micro=micro, accum=accum, planned=planned)
    basis = (
        f"`pitstop plan` predicts up to {planned} fits"
        if planned
        else "doubling: the planner did not size this run"
    )
    return use(
        RemedyId.MICRO_BATCH,
        micro=micro,
        accum=accum or 1,
        new_micro=step[0],
        new_accum=step[1],
        planned=planned,
        basis=basis,
    )
