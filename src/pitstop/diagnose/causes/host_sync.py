"""The host blocking on the GPU every step (``.item()``, prints, synchronous copies), so the queue drains:
worth the time the host spends blocked, only while the GPU idles. Removing every idle gap leaves the GPU's own
busy time, so the estimate is never above 1 / (the GPU's busy share of the step)."""

from __future__ import annotations

from pitstop.core.findings import Finding, use
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, RuntimeApi, Severity, Workload
from pitstop.diagnose.activity import read_activity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl
from pitstop.remedies import advise


@cause(
    CauseId.HOST_SYNC,
    title="Host blocks on the GPU every step",
    because="the host blocks on the GPU every step (.item(), prints, sync copies), so the queue drains",
    needs_gpu=True,
    needs=((Evidence.PROCESS, Evidence.TRACE_KERNELS),),
    fires_when="≥ 1 blocking host sync per step while the GPU idles",
    estimate="the host's blocked share, at most 1 / the GPU's busy share of the step",
    remedies=(RemedyId.FEWER_SYNCS,),
)
def host_sync(ctx: RuleContext) -> Finding | None:
    """Blocking syncs cost what the host spends blocked in them: while it waits it cannot queue the next
    kernels, so the GPU drains and then idles. Syncs on an already idle (host-bound) GPU block for ~0 and
    are not the cause; the idle-time rules cover that case."""
    if not ctx.on_gpu:
        return None
    m = ctx.metrics
    per_step, blocked = m.syncs_per_step, m.sync_frac  # from the steps: timed live, or read from a trace
    if per_step is None or per_step < 1 or blocked is None:
        return None
    exposed = _exposed_blocking(ctx)
    if exposed is not None:  # a trace says what the GPU did meanwhile: only the time it idled is lost
        blocked = min(blocked, exposed)
    if blocked < 0.02:
        return None
    util = m.gpu_util
    act = read_activity(ctx.profile)
    starved = act is not None and act.starved
    if util is not None and util >= 0.95 and not starved:
        return None  # (a utilization that reads full while the SMs are empty says nothing)
    evidence: dict[str, object] = {
        "syncs_per_step": round(per_step, 2),
        "blocked_frac_of_step": round(blocked, 3),  # while the GPU idled, where a trace tells
        "gpu_util": None if util is None else round(util, 3),
    }
    if act is not None:
        evidence.update(act.evidence())
    splits = [t.idle_split.host_wait for t in ctx.traces if t.idle_split is not None]
    if splits:
        evidence["idle_that_is_host_wait"] = round(max(splits), 3)
    calls = sorted(
        (
            c
            for t in ctx.traces
            for c in t.runtime_calls
            if c.kind in (RuntimeApi.SYNC, RuntimeApi.BLOCKING_COPY)
        ),
        key=lambda c: -c.frac_of_step,
    )
    if calls:  # the trace's own runtime time: which call the host waited in, and what the GPU did meanwhile
        evidence["blocking_calls"] = {
            c.name: {
                "frac_of_step": c.frac_of_step,
                "calls_per_step": c.calls_per_step,
                "gpu_busy": c.gpu_busy_frac,
            }
            for c in calls[:3]
        }
    busy = gpu_busy_share(ctx)
    est = amdahl(blocked, float("inf"))
    basis = "host time blocked in synchronizing calls (measured) bounds what removing them wins"
    if busy:
        evidence["gpu_busy_frac"] = round(busy, 3)
        basis += f"; the GPU was busy {busy:.0%} of the step: at most ×{1 / busy:.2f}"
        est = min(est, 1 / busy)
    unit = "batch" if any(t.workload == Workload.INFERENCE for t in ctx.traces) else "step"
    where = (
        f" ({calls[0].name} {calls[0].frac_of_step:.0%} of the {unit}"
        + (f", GPU busy {calls[0].gpu_busy_frac:.0%} meanwhile" if calls[0].gpu_busy_frac is not None else "")
        + ")"
        if calls
        else ""
    )
    return Finding(
        cause=CauseId.HOST_SYNC,
        severity=Severity.HIGH
        if blocked >= 0.25
        else (Severity.MEDIUM if blocked >= 0.05 and per_step >= 2 else Severity.LOW),
        confidence=0.8 if starved else 0.7,  # the counters agree: the GPU is not kept full
        summary=(
            f"The host blocks on the GPU {per_step:.1f} times per {unit} (.item(), .cpu(), synchronize) and waits "
            f"{blocked:.0%} of the {unit} there{where}, so the launch queue drains and the GPU idles while the "
            "next kernels are issued."
            + (f" The hardware counters agree: {act.words()}." if starved and act is not None else "")
        ),
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=advise(ctx.framework, use(RemedyId.FEWER_SYNCS)),
    )


def _exposed_blocking(ctx: RuleContext) -> float | None:
    """The share of the step the host sat in blocking calls while the GPU idled, from the traces' runtime calls
    (a wait while the GPU computes hides behind its work); None without a trace that timed them."""
    shares = [
        sum(
            c.frac_of_step * (1.0 - c.gpu_busy_frac)
            for c in t.runtime_calls
            if c.kind in (RuntimeApi.SYNC, RuntimeApi.BLOCKING_COPY) and c.gpu_busy_frac is not None
        )
        for t in ctx.traces
        if t.runtime_calls
    ]
    return max(shares) if shares else None


def gpu_busy_share(ctx: RuleContext) -> float | None:
    """How busy the GPU was over the steps: a trace's union of all GPU work (kernels, copies, sets), else the
    measured utilization. Removing idle time cannot make a step shorter than this share of it."""
    traced = [t.gpu_busy_frac for t in ctx.traces if t.gpu_busy_frac]
    if traced:
        return max(traced)
    util = ctx.metrics.gpu_util
    return util if util and util > 0 else None
