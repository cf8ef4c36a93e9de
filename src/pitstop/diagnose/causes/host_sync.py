"""The host blocking on the GPU every step (``.item()``, prints, synchronous copies), so the queue drains:
worth the time the host spends blocked, only while the GPU idles."""

from __future__ import annotations

from pitstop.core.findings import Finding, use
from pitstop.core.vocabulary import CauseId, RemedyId, Severity
from pitstop.diagnose.activity import read_activity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl
from pitstop.remedies import advise


@cause(
    CauseId.HOST_SYNC,
    title="Host blocks on the GPU every step",
    because="the host blocks on the GPU every step (.item(), prints, sync copies), so the queue drains",
    needs_gpu=True,
    fires_when="≥ 1 blocking host sync per step while the GPU idles",
    estimate="bounded by the idle share",
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
    if per_step is None or per_step < 1 or blocked is None or blocked < 0.02:
        return None
    util = m.gpu_util
    act = read_activity(ctx.profile)
    starved = act is not None and act.starved
    if util is not None and util >= 0.95 and not starved:
        return None  # (a utilization that reads full while the SMs are empty says nothing)
    evidence: dict[str, object] = {
        "syncs_per_step": round(per_step, 2),
        "blocked_frac_of_step": round(blocked, 3),
        "gpu_util": None if util is None else round(util, 3),
    }
    if act is not None:
        evidence.update(act.evidence())
    splits = [t.idle_split.host_wait for t in ctx.traces if t.idle_split is not None]
    if splits:
        evidence["idle_that_is_host_wait"] = round(max(splits), 3)
    return Finding(
        cause=CauseId.HOST_SYNC,
        severity=Severity.HIGH
        if blocked >= 0.25
        else (Severity.MEDIUM if blocked >= 0.05 and per_step >= 2 else Severity.LOW),
        confidence=0.8 if starved else 0.7,  # the counters agree: the GPU is not kept full
        summary=(
            f"The host blocks on the GPU {per_step:.1f} times per step (.item(), .cpu(), synchronize) and waits "
            f"{blocked:.0%} of the step there, so the launch queue drains and the GPU idles while the next "
            "kernels are issued."
            + (f" The hardware counters agree: {act.words()}." if starved and act is not None else "")
        ),
        evidence=evidence,
        est_speedup=amdahl(blocked, float("inf")),
        speedup_basis="host time blocked in synchronizing calls (measured) bounds what removing them wins",
        fix=advise(ctx.framework, use(RemedyId.FEWER_SYNCS)),
    )
