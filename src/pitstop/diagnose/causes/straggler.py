"""One rank holding the others back: who arrives last at the collectives (timed live), or whose steps,
traces or data wait run longest, and why (its GPU's clocks, its CPU load, its part of the step)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from pitstop.core.findings import Finding, use
from pitstop.core.profile import RankProfile, TraceStats
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, Severity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.causes.gpu_throttled import per_gpu_clocks
from pitstop.diagnose.causes.mixed_gpus import slow_card_ranks
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.diagnose.metrics import rank_metrics
from pitstop.diagnose.ranks import RankComm
from pitstop.remedies import advise

CPU_OVERLOADED = 1.25  # runnable threads per allowed core: threads wait for a core
CPU_PEER_MARGIN = 1.5  # the slow rank's CPU load over its peers' median
CPU_STEAL = 0.1  # share of CPU time the hypervisor took
DEFERRED_REASONS = ("compute", "unknown")  # a late rank's reasons a slower GPU model explains (mixed_gpus)


def _late_arrival(ctx: RuleContext) -> tuple[int, float, str, str, str, dict[str, object], str] | None:
    """The rank the others wait for at collectives, from traces of several ranks with aligned clocks:
    (slow rank, share of the step the others wait, reason's kind, reason, summary, evidence, basis)."""
    rows = {
        r.rank: _Traced(r, t, 1000 * r.mean_step_s)
        for r, t in ctx.traced
        if t.arrival_late_ms is not None and r.mean_step_s
    }
    if len(rows) < 2:
        return None
    slow_rank = max(rows, key=lambda k: rows[k].trace.arrival_late_ms or 0.0)
    slow_row = rows[slow_rank]
    slow = slow_row.trace
    others = [row for k, row in rows.items() if k != slow_rank]
    waiting = statistics.fmean(min((o.trace.collective_wait_ms or 0.0) / o.step_ms, 1.0) for o in others)
    peer = "the other rank" if len(others) == 1 else "the median rank"
    kind, reason = _why_late(slow_row, others, peer)
    late = slow.arrival_late_ms or 0.0
    summary = (
        f"Rank {slow_rank} holds every rank back: the others wait {waiting:.0%} of the step for it at "
        f"collectives (it arrives {late:.2f} ms after {peer} on average, last at "
        f"{slow.last_arrival_frac or 0.0:.0%} of them); {reason}."
    )
    evidence: dict[str, object] = {
        "slow_rank": slow_rank,
        "waiting_frac_others": round(waiting, 3),
        "arrival_skew_ms": round(statistics.median(o.trace.arrival_skew_ms or 0.0 for o in rows.values()), 3),
        "arrival_late_ms": round(late, 3),
        "last_arrival_frac": round(slow.last_arrival_frac or 0.0, 3),
        "reason": reason,
        "slow_rank_step_s": round(slow_row.step_ms / 1000, 4),
        "ranks": len(rows),
    }
    basis = (
        "time the other ranks' collectives wait for the last rank to arrive (traces, clocks aligned on the "
        "ends of matching collectives); all of it is lost by every rank"
    )
    return slow_rank, waiting, kind, reason, summary, evidence, basis


@dataclass
class _Traced:
    """A rank read from a trace: its profile, its trace's statistics, its mean step time in ms."""

    rank: RankProfile
    trace: TraceStats
    step_ms: float


def _kernel_ms(row: _Traced) -> float | None:
    return row.trace.breakdown_ms.kernel if row.trace.breakdown_ms is not None else None


def _loader_ms(row: _Traced) -> float | None:
    """The mean data wait of its steps, in ms."""
    total = row.rank.total("data_wait_s")
    return None if total is None else 1000 * total / len(row.rank.steps)


def _why_late(slow: _Traced, others: list[_Traced], peer: str) -> tuple[str, str]:
    """The late rank's own breakdown against the others': longer kernels (its GPU) or longer host gaps (its
    input pipeline or CPU), as (kind: "compute", "host" or "unknown", the reason in words)."""

    def excess(of: Callable[[_Traced], float | None]) -> float:
        mine = of(slow)
        theirs = [v for o in others if (v := of(o)) is not None]
        return (mine - statistics.median(theirs)) if mine is not None and theirs else 0.0

    kernel, host = excess(_kernel_ms), excess(lambda row: row.trace.host_wait_ms)
    loader = excess(_loader_ms)
    if max(kernel, host, loader) <= 0.1 * max(slow.trace.arrival_late_ms or 0.0, 1e-3):
        return "unknown", f"its own breakdown does not say why (its kernels and host gaps match {peer}'s)"
    if kernel >= max(host, loader):
        return "compute", (
            f"its GPU kernels take {kernel:.1f} ms more per step than {peer}'s (a slower or throttled GPU, "
            "or more work on this rank)"
        )
    detail = f"; its DataLoader takes {loader:.1f} ms more per step" if loader > 0.1 * max(host, 1e-3) else ""
    return "host", (
        f"its GPU waits {max(host, loader):.1f} ms more per step for the host than {peer}'s (its input "
        f"pipeline or CPU{detail})"
    )


@cause(
    CauseId.STRAGGLER,
    title="One rank holds the others back",
    because="multi-GPU: one rank is slower and everyone waits for it",
    needs_gpu=False,
    needs=(Evidence.STEPS, Evidence.ALL_RANKS),
    fires_when=(
        "the other ranks wait ≥ 5% of a step at collectives for the last rank to arrive (timed collectives "
        "live, or aligned traces); without them, one rank's data wait exceeds the median rank's by ≥ 5% of "
        "a step. A rank late for its compute on the slower card of a job that mixes GPU models is left to "
        "mixed_gpus (one finding for the same seconds)"
    ),
    estimate="1/(1 − the others' waiting share)",
    remedies=(RemedyId.BALANCE_RANKS,),
)
def straggler(ctx: RuleContext) -> Finding | None:
    """The rank the others wait for, named by when it arrives at collectives, with its reason.

    Live, with timed collectives (``ctx.ranks``): the rank that arrives last (clocks aligned on collective
    ends), its reason the part of its own step that is longer than the other ranks'. From traces of several
    ranks: the same, from the traces' collectives. Otherwise only data wait is compared: it is local to a rank,
    while forward and backward time include waiting for peers, which host clocks alone cannot separate.
    """
    if ctx.ranks is not None:
        return _straggler_by_arrival(ctx)
    return _straggler_from_traces_or_data_wait(ctx)


REASONS = {
    "data_s": "input pipeline",
    "compute_s": "forward/backward compute",
    "optimizer_s": "optimizer step",
    "other_s": "host work outside forward, backward and the optimizer",
}


def _slowest_part(slow: RankComm, others: list[RankComm]) -> tuple[str, str]:
    """The part of the step (data, compute, optimizer, host) where the slow rank loses most against the
    others' median, as (reason, detail); ("unknown", "") when no part is slower."""
    excess: dict[str, float] = {}
    for name in REASONS:
        mine = getattr(slow, name)
        theirs = [getattr(r, name) for r in others if getattr(r, name) is not None]
        if mine is not None and theirs:
            excess[name] = mine - statistics.median(theirs)
    part = max(excess, key=lambda k: excess[k]) if excess else None
    theirs_s = (
        statistics.median(getattr(r, part) for r in others if getattr(r, part) is not None) if part else None
    )
    reason = "unknown"
    detail = ""
    if part is not None and excess[part] > 0:
        reason = {"data_s": "data", "compute_s": "compute", "optimizer_s": "optimizer", "other_s": "host"}[
            part
        ]
        detail = (
            f"its {REASONS[part]} takes {getattr(slow, part) * 1000:.0f} ms per step vs "
            f"{(theirs_s or 0.0) * 1000:.0f} ms on the other rank{'s (median)' if len(others) > 1 else ''}"
        )
    return reason, detail


def _straggler_by_arrival(ctx: RuleContext) -> Finding | None:
    a = ctx.ranks
    assert a is not None
    slow_rank = a.straggler
    if slow_rank is None:
        return None
    rows = {r.rank: r for r in a.ranks}
    slow = rows[slow_rank]
    others = [r for r in a.ranks if r.rank != slow_rank]
    waiting = a.mean_frac("wait_s", exclude=slow_rank)
    if waiting < 0.05 or not others:
        return None
    reason, detail = _slowest_part(slow, others)
    if reason in DEFERRED_REASONS and slow_rank in slow_card_ranks(ctx):
        return None  # its slower GPU model explains it: mixed_gpus names the card and the same seconds
    extras = _device_reasons(ctx, slow_rank)
    if extras:
        detail += ("; " if detail else "") + "; ".join(extras)
    waiters = ", ".join(str(r.rank) for r in others[:8]) + (" …" if len(others) > 8 else "")
    persistent = a.persistent
    lead = (
        f"Rank {slow_rank} arrives last in {a.straggler_last_frac or 0.0:.0%} of the steps (at the collective "
        f"the others wait longest at), {a.skew_s * 1000:.0f} ms after the other ranks (median)"
    )
    if not persistent:
        lead = (
            f"The last rank to arrive at collectives changes from step to step (rank {slow_rank} most often, "
            f"{a.straggler_last_frac or 0.0:.0%}): noise rather than one bad device"
        )
    summary = (
        f"{lead}{': ' + detail if detail else ''}. Rank{'s' if len(others) > 1 else ''} {waiters} "
        f"spend{'' if len(others) > 1 else 's'} {waiting:.0%} of each step waiting for it."
    )
    waits = {str(r.rank): round(r.data_s / r.step_s, 3) for r in a.ranks if r.step_s}
    severity = severity_for(waiting, 0.25, 0.10)
    if not persistent and severity is Severity.HIGH:
        severity = Severity.MEDIUM
    return Finding(
        cause=CauseId.STRAGGLER,
        severity=severity,
        confidence=0.85 if persistent else 0.5,
        summary=summary,
        evidence={
            "slow_rank": slow_rank,
            "reason": reason,
            "reason_detail": detail or None,
            "persistent": persistent,
            "arrival_skew_ms": round(a.skew_s * 1000, 2),
            "arrived_last_frac": None if a.straggler_last_frac is None else round(a.straggler_last_frac, 3),
            "others_wait_frac_of_step": round(waiting, 3),
            "wait_frac_per_rank": {str(r.rank): round(r.wait_s / r.step_s, 3) for r in a.ranks if r.step_s},
            "own_compute_ms_per_rank": {
                str(r.rank): None if r.compute_s is None else round(r.compute_s * 1000, 2) for r in a.ranks
            },
            "data_wait_frac_per_rank": waits,
            "last_rank_by_step": {str(k): v for k, v in a.last_by_step.items()},
            "slow_rank_step_s": round(slow.step_s, 4),
            "clock": a.clock,
        },
        est_speedup=amdahl(waiting, float("inf")),
        speedup_basis="arrival skew at collectives (clocks aligned on collective ends): the other ranks' "
        "waiting for this rank is lost by all",
        fix=advise(ctx.framework, use(RemedyId.BALANCE_RANKS, slow_rank=slow_rank, reason=detail or reason)),
    )


def _device_reasons(ctx: RuleContext, slow_rank: int) -> list[str]:
    """What the slow rank's machine says: lower SM clocks than its peers (with NVML's clock-event reasons),
    allocator retries, a CPU shared with more runnable threads than its peers'."""
    out = []
    clocks: dict[int, float] = {}
    retries: dict[int, int] = {}
    for r in ctx.profile.ranks:
        values = [s.sm_clock for s in r.gpu_samples if s.sm_clock]
        if values:
            clocks[r.rank] = statistics.fmean(values)
        if r.memory.alloc_retries is not None:
            retries[r.rank] = r.memory.alloc_retries
    if slow_rank in clocks and len(clocks) > 1:
        peers = statistics.median(v for k, v in clocks.items() if k != slow_rank)
        if clocks[slow_rank] < 0.9 * peers:
            judged = per_gpu_clocks(ctx).get(slow_rank)
            why = f" ({', '.join(judged.reasons)})" if judged is not None and judged.reasons else ""
            out.append(f"its GPU runs at {clocks[slow_rank]:,.0f} MHz vs {peers:,.0f} MHz on the others{why}")
    if retries.get(slow_rank, 0) > 0 and retries[slow_rank] > max(
        (v for k, v in retries.items() if k != slow_rank), default=0
    ):
        out.append(f"its allocator retried {retries[slow_rank]} times (memory pressure)")
    starved = _starved_cpu(ctx, slow_rank)
    if starved:
        out.append(starved)
    return out


def _cpu_load(rank: RankProfile) -> tuple[float, float] | None:
    """(runnable threads on the rank's machine per core it may use, hypervisor steal share)."""
    cpu = rank.environment.cpu
    if cpu is None or not cpu.cores_allowed or cpu.machine_run_queue is None:
        return None
    return cpu.machine_run_queue / cpu.cores_allowed, cpu.steal_frac or 0.0


def _starved_cpu(ctx: RuleContext, slow_rank: int) -> str | None:
    """The slow rank's CPU is shared with more runnable threads per core than its peers' (other processes,
    or the hypervisor taking time), measured from /proc during the window."""
    loads = {r.rank: load for r in ctx.profile.ranks if (load := _cpu_load(r)) is not None}
    if slow_rank not in loads or len(loads) < 2:
        return None
    queue, steal = loads[slow_rank]
    peer_queue = statistics.median(q for k, (q, _) in loads.items() if k != slow_rank)
    peer_steal = statistics.median(s for k, (_, s) in loads.items() if k != slow_rank)
    if queue > CPU_OVERLOADED and queue > CPU_PEER_MARGIN * peer_queue:
        return f"its CPU is oversubscribed: {queue:.1f} runnable threads per core vs {peer_queue:.1f} on the others"
    if steal >= CPU_STEAL and steal > CPU_PEER_MARGIN * peer_steal:
        return f"the hypervisor takes {steal:.0%} of its CPU time (steal) vs {peer_steal:.0%} on the others"
    return None


def _straggler_from_traces_or_data_wait(ctx: RuleContext) -> Finding | None:
    arrival = _late_arrival(ctx)
    if arrival is not None:
        slow_rank, gap, kind, reason, summary, evidence, basis = arrival
        if gap < 0.05:
            return None
        if kind in DEFERRED_REASONS and slow_rank in slow_card_ranks(ctx):
            return None  # its slower GPU model explains it: mixed_gpus names the card and the same seconds
    else:
        ranks = [r for r in ctx.profile.ranks if r.steps]
        if len(ranks) < 2:
            return None
        rows = {r.rank: rank_metrics(r) for r in ranks}
        waits = {k: v.data_wait_frac or 0.0 for k, v in rows.items()}
        median = statistics.median(waits.values())
        slow_rank = max(waits, key=lambda k: waits[k])
        gap = waits[slow_rank] - median
        if gap < 0.05:
            return None
        slow = rows[slow_rank]
        fastest = min(waits, key=lambda k: waits[k])
        # two ranks have no median: the other one is what a user compares with; more have a median and a fastest
        versus = (
            f"{waits[fastest]:.0%} on the other rank"
            if len(waits) == 2
            else f"{median:.0%} on the median rank and {waits[fastest]:.0%} on the fastest (rank {fastest})"
        )
        reason = f"it waits on its input pipeline {waits[slow_rank]:.0%} of the step vs {versus}"
        summary = f"Rank {slow_rank} holds every rank back: {reason}."
        evidence = {
            "slow_rank": slow_rank,
            "gap_frac_of_step": round(gap, 3),
            "data_wait_frac_per_rank": {str(k): round(v, 3) for k, v in sorted(waits.items())},
            "slow_rank_step_s": None if slow.step_time_s is None else round(slow.step_time_s, 4),
        }
        basis = (
            "per-rank data wait (measured); what the slowest rank waits beyond the median rank is lost by all"
        )
    return Finding(
        cause=CauseId.STRAGGLER,
        severity=severity_for(gap, 0.25, 0.10),
        confidence=0.75,
        summary=summary,
        evidence=evidence,
        est_speedup=amdahl(gap, float("inf")),
        speedup_basis=basis,
        fix=advise(ctx.framework, use(RemedyId.BALANCE_RANKS, slow_rank=slow_rank, reason=reason)),
    )
