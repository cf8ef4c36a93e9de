"""A batch too small to fill the GPU: utilization (or SM activity) low while the job computes, with memory
headroom the planner can size a larger micro-batch into.

Where a trace recorded the operators' shapes, the batch is known (trace/shapes.py) and the estimate comes
from how the step would scale with it: the kernels' time above their latency floor, the host-to-device
copies and a single-process loader's collation grow with the batch; the rest of the step (the Python loop,
the launches, the kernels' floors, the optimizer) is paid once per step. A batch already large whose
per-sample cost is mostly not the GPU's means the model is too small for the GPU, and says so."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pitstop.core.findings import Finding, Use, use
from pitstop.core.profile import TraceBatch, TraceStats
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, RuntimeApi
from pitstop.diagnose.activity import Activity, read_activity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, severity_for
from pitstop.diagnose.gpu_windows import working
from pitstop.diagnose.metrics import SAMPLED
from pitstop.plan.from_run import has_shape, setup_for_run
from pitstop.plan.memory import GIB
from pitstop.plan.planner import largest_micro_batch
from pitstop.remedies import advise
from pitstop.remedies.micro_batch import next_micro_batch

MAX_FACTOR = 16  # the largest batch factor suggested without the planner: a trace does not say the memory
LARGE_BATCH = 1024  # samples per step past which a larger batch is rarely what fills a GPU
GPU_SHARE_SMALL = 0.5  # the GPU's share of the per-sample time under which the model is too small for it
SM_FULL = 0.8  # SM activity a well-filled GPU reaches (est. target for small_batch from the counters)
OCC_FULL = 0.5  # occupancy both counters agree below, with SM activity under SM_FULL
BLOCKED_EXPLAINS = 0.5  # share of a traced step the host sat in blocking runtime calls with the GPU idle


def _busy_while_computing(ctx: RuleContext) -> tuple[float | None, dict[str, object], str]:
    """The GPU busy share small_batch judges by, its evidence, and the words for it.

    From GPU samples: per GPU, over the job's active time only (gpu_windows.py), averaged over the GPUs
    that worked; a GPU that never worked is idle_gpu's and a pause of the job is not an under-filled
    batch. From a trace alone: the trace's kernel-busy share of the step."""
    m = ctx.metrics
    windows = working(ctx.results.gpus)
    if m.source_of_util not in SAMPLED:
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
    needs=(Evidence.GPU_UTILIZATION,),
    fires_when=(
        "utilization < 75% while the job computes (per GPU, mean over the GPUs that worked; a trace's "
        "kernel-busy share without samples), memory headroom, not explained by data wait nor by the host "
        "blocked in allocator / synchronize calls with the GPU idle ({BLOCKED_EXPLAINS:.0%}+ of a traced "
        "step); or SM activity "
        "under {SM_FULL:.0%} from the activity counters. A batch of {LARGE_BATCH}+ samples whose per-sample "
        "time is under {GPU_SHARE_SMALL:.0%} GPU work reads as a model too small for the GPU"
    ),
    estimate="with the batch read from the trace's recorded shapes: samples/s at k× the batch = k·S/(F + k·P), "
    "P the step's time that grows with the batch (kernels above their latency floor, host-to-device copies, a "
    "single-process loader), F the rest; k where P·k reaches F, at most S/P. Batch unknown: at most "
    "1/utilization (capped at 4×)",
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
    if host_blocked_while_idle(ctx.traces) >= BLOCKED_EXPLAINS:
        return (
            None  # the host sits in allocator / sync calls while the GPU idles: allocator_thrash, host_sync
        )
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
    scaling = batch_scaling(ctx.traces)
    if scaling is not None:
        return _small_batch_known(ctx, util, when, scaling, evidence, planned)
    confidence = 0.7 if mem is not None or ctx.traces else 0.5
    if m.source_of_util in ("nvidia-smi", "dcgm") and m.data_wait_frac is None:
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
        "most 1/util (capped at 4×)"
        + ("; batch unknown (the trace recorded no shapes)" if ctx.traces else ""),
        fix=advise(ctx.framework, _for_workload(ctx, micro_batch_use(ctx, planned))),
    )


@dataclass(frozen=True)
class BatchScaling:
    """How one traced step's time splits between what grows with the batch (``per_sample_ms``, P) and what
    a step pays once (``fixed_ms``, F), in ms per step; samples/s at k× the batch is k·S/(F + k·P)."""

    batch: TraceBatch
    step_ms: float
    gpu_ms: float  # kernels' time above their latency floor: grows with the batch
    copy_ms: float  # host-to-device copies: grow with the batch
    load_ms: float  # a single-process loader's wait (its collation runs per sample in the step)
    busy: float | None  # the GPU's kernel-busy share of the step
    host_ms: tuple[tuple[str, float], ...] = ()  # the step's host-side parts (the breakdown's), largest first

    def fixed_words(self) -> str:
        """What the once-per-step part is made of: the host's largest parts, then the kernels' floors."""
        parts = [f"{name} {ms:.2f} ms" for name, ms in self.host_ms[:3] if ms >= 0.05 * self.step_ms]
        floor = self.batch.kernel_floor_ms
        if floor:
            parts.append(f"kernels' floors {floor:.2f} ms")
        return "; ".join(parts) or "the Python loop, launches, the optimizer"

    @property
    def per_sample_ms(self) -> float:
        return max(self.gpu_ms + self.copy_ms + self.load_ms, 1e-6)

    @property
    def fixed_ms(self) -> float:
        return max(self.step_ms - self.per_sample_ms, 0.0)

    @property
    def samples(self) -> int:
        return (self.batch.samples or 0) * self.batch.forwards_per_step

    def gain(self, k: float) -> float:
        """Samples/s at k× the batch over today's, the step's parts summed end to end (no overlap assumed)."""
        return k * self.step_ms / (self.fixed_ms + k * self.per_sample_ms)

    @property
    def bound(self) -> float:
        """The gain however large the batch: the per-sample time stays."""
        return self.step_ms / self.per_sample_ms

    @property
    def factor(self) -> int:
        """The batch factor to suggest: a power of two near where the growing part reaches the fixed one
        (half the bound; past it each doubling gives less), at least 2."""
        knee = self.fixed_ms / self.per_sample_ms
        return max(2, 2 ** round(math.log2(knee))) if knee > 1 else 2

    @property
    def gpu_share(self) -> float:
        """The GPU's share of the per-sample time."""
        return self.gpu_ms / self.per_sample_ms

    @property
    def model_too_small(self) -> bool:
        return self.samples >= LARGE_BATCH and self.gpu_share < GPU_SHARE_SMALL


def batch_scaling(traces: list[TraceStats]) -> BatchScaling | None:
    """The scaling of the first trace whose shapes gave the batch and whose steps have a breakdown."""
    for t in traces:
        b, parts = t.batch, t.breakdown_ms
        if b is None or not b.samples or parts is None or b.kernel_ms is None:
            continue
        step = sum(getattr(parts, f) for f in parts.__dataclass_fields__)
        if step <= 0:
            continue
        return BatchScaling(
            batch=b,
            step_ms=step,
            gpu_ms=max(b.kernel_ms - (b.kernel_floor_ms or 0.0), 0.0),
            copy_ms=b.h2d_ms or 0.0,
            load_ms=parts.dataloader if t.dataloader_multiprocess is False else 0.0,
            busy=t.gpu_util,
            host_ms=tuple(
                sorted(
                    (
                        ("runtime API", parts.runtime),
                        ("CPU ops", parts.cpu_exec),
                        ("other host time", parts.other),
                        (
                            "loader wait",
                            parts.dataloader
                            - (parts.dataloader if t.dataloader_multiprocess is False else 0.0),
                        ),
                    ),
                    key=lambda kv: -kv[1],
                )
            ),
        )
    return None


def _batch_words(b: TraceBatch) -> str:
    """'16 samples (aten::linear input, weight [256, 2056])', with tokens and forwards where known."""
    words = f"{b.samples:,} samples"
    if b.tokens:
        words += f" ({b.tokens:,} tokens)"
    if b.forwards_per_step > 1:
        words += f" × {b.forwards_per_step} forwards per step"
    return words


def _small_batch_known(
    ctx: RuleContext,
    util: float,
    when: str,
    sc: BatchScaling,
    evidence: dict[str, object],
    planned: int | None,
) -> Finding:
    """small_batch where the trace's shapes gave the batch: the estimate from how the step scales with it,
    or, for a batch already large whose per-sample cost is not the GPU's, the model too small for the GPU."""
    b = sc.batch
    k = sc.factor
    micro = ctx.env.micro_batch_size
    # the planner knows the memory: no larger than what it says fits; else no more than MAX_FACTOR
    k = max(2, min(k, planned // micro)) if planned and micro else min(k, MAX_FACTOR)
    evidence.update(
        {
            "batch_samples": b.samples,
            "batch_tokens": b.tokens,
            "forwards_per_step": b.forwards_per_step,
            "batch_read_from": f"{b.input_op} input (weight {b.weight_dims})",
            "step_ms": round(sc.step_ms, 3),
            "grows_with_batch_ms": round(sc.per_sample_ms, 3),
            "kernels_above_floor_ms": round(sc.gpu_ms, 3),
            "kernel_ms": b.kernel_ms,
            "h2d_copy_ms": round(sc.copy_ms, 3),
            "loader_ms_counted": round(sc.load_ms, 3),
            "per_step_ms": round(sc.fixed_ms, 3),
            "gemm_gflop_per_step": b.gemm_gflop,
            "gain_bound": round(sc.bound, 2),
        }
    )
    basis_head = (
        f"batch {_batch_words(b)} read from the trace's recorded shapes ({b.input_op}); of the "
        f"{sc.step_ms:.2f} ms step, {sc.per_sample_ms:.2f} ms grows with the batch (kernels above their "
        f"{b.floor_us:.0f} µs latency floor {sc.gpu_ms:.2f} ms, host-to-device copies "
        f"{sc.copy_ms:.2f} ms" + (f", loading {sc.load_ms:.2f} ms" if sc.load_ms else "") + f") and "
        f"{sc.fixed_ms:.2f} ms is paid once per step ({sc.fixed_words()}); samples/s at k× the batch = k·S/(F + k·P), parts summed end to end"
    )
    busy = f"the GPU is busy {util:.0%} {when}"
    if sc.model_too_small:
        return _model_too_small(ctx, util, when, sc, evidence, basis_head)
    est = sc.gain(k)
    evidence["suggested_batch"] = (b.samples or 0) * k
    summary = (
        f"The GPU is busy only {util:.0%} {when} with a batch of {_batch_words(b)}: "
        f"{sc.fixed_ms:.2f} of the {sc.step_ms:.2f} ms step is paid once per step whatever the batch, "
        f"and only {sc.per_sample_ms:.2f} ms grows with it, so a larger batch spreads the fixed cost "
        f"over more samples (×{est:.1f} at {k}× the batch, at most ×{sc.bound:.1f})."
    )
    new = (b.samples or 0) * k
    if micro and micro != b.samples:
        fix_use = micro_batch_use(ctx, planned)
    else:
        why = (
            f"`pitstop plan` predicts up to {planned} fits"
            if planned
            else "where the step's per-sample part reaches its fixed part; check that it fits in memory"
        )
        fix_use = use(RemedyId.MICRO_BATCH, micro=b.samples, new_micro=new, planned=planned, basis=why)
    return Finding(
        cause=CauseId.SMALL_BATCH,
        severity=severity_for(1 - 1 / est, 0.5, 0.25),
        confidence=0.75 if b.agreeing and b.agreeing >= 0.9 else 0.6,
        summary=summary,
        evidence=evidence,
        est_speedup=est,
        speedup_basis=f"{basis_head}: ×{est:.2f} at {k}× the batch ({new:,} samples), at most "
        f"×{sc.bound:.2f} however large (S/P); {busy}, of which the kernels' floors do not grow",
        fix=advise(ctx.framework, _for_workload(ctx, fix_use)),
    )


def _model_too_small(
    ctx: RuleContext, util: float, when: str, sc: BatchScaling, evidence: dict[str, object], basis_head: str
) -> Finding:
    """A batch of thousands whose per-sample time is mostly copies and loading: the GPU idles because the
    model gives it little to do, and a larger batch grows the copies with the work."""
    b = sc.batch
    gain2 = sc.gain(2)
    no_copy = sc.step_ms / max(sc.step_ms - sc.copy_ms, 1e-6)  # what the advice (no per-step copy) gives
    per_sample_us = sc.gpu_ms / max(sc.samples, 1) * 1000
    evidence["gpu_share_of_per_sample"] = round(sc.gpu_share, 3)
    evidence["model_too_small"] = True
    math_words = ""
    gpu = ctx.gpu
    dtype = ctx.env.autocast_dtype or ctx.env.param_dtype or "fp32"
    peak = gpu.peak_flops(dtype) if gpu is not None else None
    if b.gemm_gflop and peak:
        at_peak = b.gemm_gflop * 1e9 / peak * 1000
        evidence["gemm_ms_at_peak"] = round(at_peak, 4)
        math_words = (
            f" (its {b.gemm_gflop:.1f} GFLOP of matrix math per step take {at_peak:.2f} ms at {dtype} peak)"
        )
    elif b.gemm_gflop:
        math_words = f" ({b.gemm_gflop:.1f} GFLOP of matrix math per step)"
    other = sc.step_ms - (b.kernel_ms or 0.0) - sc.copy_ms
    summary = (
        f"The model is too small for this GPU: with a batch of {_batch_words(b)} the GPU is busy only "
        f"{util:.0%} {when}, {b.kernel_ms:.2f} ms of kernels per {sc.step_ms:.2f} ms step "
        f"({per_sample_us:.2f} µs per sample){math_words}. The step goes to copying the batch to the GPU "
        f"({sc.copy_ms:.2f} ms, {sc.copy_ms / sc.step_ms:.0%}) and to the host ({other:.2f} ms); a larger "
        f"batch grows the copy with the work (×{gain2:.2f} at 2×, at most ×{sc.bound:.1f})."
    )
    fix_use = use(
        RemedyId.MICRO_BATCH,
        micro=b.samples,
        model_small=True,
        copy_ms=round(sc.copy_ms, 3),
        host_ms=round(other, 3),
    )
    return Finding(
        cause=CauseId.SMALL_BATCH,
        severity=severity_for(1 - 1 / no_copy, 0.6, 0.4),
        confidence=0.6,
        summary=summary,
        evidence=evidence,
        est_speedup=no_copy,
        speedup_basis=f"{basis_head}: ×{gain2:.2f} at 2× the batch, at most ×{sc.bound:.2f} however large "
        f"(S/P); the GPU's kernels are {sc.gpu_share:.0%} of the time that grows with the batch, so the "
        f"batch is not what keeps the GPU idle. The advice (no copy per step) gives at most ×{no_copy:.2f}: "
        f"the {sc.copy_ms:.2f} ms copy gone from the {sc.step_ms:.2f} ms step",
        fix=advise(ctx.framework, _for_workload(ctx, fix_use)),
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
        fix=advise(ctx.framework, _for_workload(ctx, micro_batch_use(ctx, planned))),
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


def host_blocked_while_idle(traces: list[TraceStats]) -> float:
    """The largest share of a traced step the host spent blocked in allocator, synchronize or blocking-copy
    calls while the GPU had nothing to do: idle time those calls explain, not the batch."""
    blocking = (RuntimeApi.ALLOC, RuntimeApi.SYNC, RuntimeApi.BLOCKING_COPY)
    shares = [
        sum(c.frac_of_step * (1.0 - (c.gpu_busy_frac or 0.0)) for c in t.runtime_calls if c.kind in blocking)
        for t in traces
    ]
    return max(shares, default=0.0)


def _for_workload(ctx: RuleContext, fix: Use) -> Use:
    """An inference trace's advice: more examples per forward, no accumulation (the remedy's ``inference``)."""
    if not ctx.inference or fix.params.get("model_small"):
        return fix
    return use(fix.remedy, **{**fix.params, "inference": True})


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
