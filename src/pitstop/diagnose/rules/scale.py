"""Rules about memory placement and many ranks: offload, stragglers."""

from __future__ import annotations

import statistics

from pitstop.diagnose import fixes
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.diagnose.metrics import rank_metrics
from pitstop.findings import Finding
from pitstop.plan.from_run import setup_for_run
from pitstop.plan.memory import model_states
from pitstop.profile import Environment

GPU_MEMORY_USABLE = 0.6  # leave the rest for activations, workspace and fragmentation


def states_without_offload(env: Environment, gpus: int) -> float | None:
    """Bytes per GPU the weights, gradients and optimizer would take on the GPU: the planner's model
    (DeepSpeed's accounting), so `doctor` and `plan` agree on what fits."""
    setup = setup_for_run(env, gpus=gpus)
    return None if setup is None else sum(model_states(setup)[:3])


def offload_bound(ctx: RuleContext) -> Finding | None:
    offload = ctx.env.offload
    if not ctx.gpu_possible or not offload:
        return None
    m = ctx.metrics
    model = ctx.env.model
    n = model.params_total
    trainable = model.params_trainable if model.params_trainable is not None else n
    gpus = ctx.profile.world_size
    gpu_mem = ctx.env.gpu_memory_bytes or (ctx.gpu.memory_gib * 2**30 if ctx.gpu else None)
    evidence: dict[str, object] = {"offload": offload, "zero_stage": ctx.env.zero_stage, "world_size": gpus}
    fits = False
    need = states_without_offload(ctx.env, gpus)
    if need is not None and gpu_mem:
        fits = need <= GPU_MEMORY_USABLE * gpu_mem
        evidence["model_states_gib_per_gpu"] = round(need / 2**30, 2)
        evidence["gpu_memory_gib"] = round(gpu_mem / 2**30, 1)
    est = None
    basis = "offload time not estimable without the parameter count"
    if n and m.step_time_s:
        link = (ctx.gpu.pcie_gbps if ctx.gpu else 31.5) * 1e9 * 0.8
        per_rank = (trainable or n) / max(gpus, 1)
        moved = 0.0
        if "optimizer" in offload:
            moved += 4 * per_rank  # bf16 gradients down, bf16 updated weights up
        if "param" in offload:
            moved += 2 * n * 2 / max(gpus, 1)  # weights fetched for forward and again for backward
        pcie_s = moved / link
        evidence["pcie_gb_per_step_est"] = round(moved / 1e9, 3)
        evidence["pcie_s_per_step_est"] = round(pcie_s, 4)
        if m.pcie_rx_gbps is not None:
            evidence["pcie_rx_gbps_measured"] = round(m.pcie_rx_gbps, 2)
            evidence["pcie_tx_gbps_measured"] = round(m.pcie_tx_gbps or 0.0, 2)
        lost = max(pcie_s, (m.optimizer_frac or 0.0) * m.step_time_s)
        frac = min(lost / m.step_time_s, 0.95)
        est = amdahl(frac, float("inf")) if fits else None
        basis = (
            f"{moved / 1e9:.2f} GB over PCIe per step at 80% of the link, or the measured optimizer time on the "
            "host, whichever is larger"
            + ("" if fits else "; no estimate while the states do not fit the GPU")
        )
    where = " and ".join(f"{k}→{v}" for k, v in sorted(offload.items()))
    summary = f"Offload ({where}) makes every step move weights or gradients over PCIe"
    summary += (
        ", yet the model states fit in GPU memory without it."
        if fits
        else "; it may be needed to fit, but sharding or LoRA usually costs less."
    )
    if not ctx.measured:
        summary += " (From the config: run `pitstop plan` or `pitstop doctor` to size it.)"
    return Finding(
        cause="offload_bound",
        severity="high" if fits else "medium",
        confidence=(0.8 if n else 0.5) if ctx.measured else 0.6,
        summary=summary,
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=fixes.offload(ctx.framework, fits, offload, gpus),
    )


def straggler(ctx: RuleContext) -> Finding | None:
    """The rank the others wait for, named by when it arrives at collectives, with its reason.

    With timed collectives (``ctx.ranks``), the straggler is the rank that arrives last (clocks aligned on
    collective ends), and its reason is the part of its own step that is longer than the other ranks'. Without
    them, only data wait is compared: it is local to a rank, while forward and backward time include waiting
    for peers, which host clocks alone cannot separate.
    """
    if ctx.ranks is not None:
        return _straggler_by_arrival(ctx)
    return _straggler_by_data_wait(ctx)


REASONS = {
    "data_s": "input pipeline",
    "compute_s": "forward/backward compute",
    "optimizer_s": "optimizer step",
    "other_s": "host work outside forward, backward and the optimizer",
}


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
            f"{(theirs_s or 0.0) * 1000:.0f} ms on the other ranks"
        )
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
    if not persistent and severity == "high":
        severity = "medium"
    return Finding(
        cause="straggler",
        severity=severity,  # type: ignore[arg-type]
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
        fix=fixes.straggler(ctx.framework, slow_rank, detail or reason),
    )


def _device_reasons(ctx: RuleContext, slow_rank: int) -> list[str]:
    """What the slow rank's device says: lower SM clocks than its peers, allocator retries."""
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
            out.append(f"its GPU runs at {clocks[slow_rank]:,.0f} MHz vs {peers:,.0f} MHz on the others")
    if retries.get(slow_rank, 0) > 0 and retries[slow_rank] > max(
        (v for k, v in retries.items() if k != slow_rank), default=0
    ):
        out.append(f"its allocator retried {retries[slow_rank]} times (memory pressure)")
    return out


def _straggler_by_data_wait(ctx: RuleContext) -> Finding | None:
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
    reason = f"it waits on its input pipeline {waits[slow_rank]:.0%} of the step vs {median:.0%} for the median rank"
    return Finding(
        cause="straggler",
        severity=severity_for(gap, 0.25, 0.10),  # type: ignore[arg-type]
        confidence=0.75,
        summary=f"Rank {slow_rank} holds every rank back: {reason}.",
        evidence={
            "slow_rank": slow_rank,
            "gap_frac_of_step": round(gap, 3),
            "data_wait_frac_per_rank": {str(k): round(v, 3) for k, v in sorted(waits.items())},
            "slow_rank_step_s": None if slow.step_time_s is None else round(slow.step_time_s, 4),
        },
        est_speedup=amdahl(gap, float("inf")),
        speedup_basis="per-rank data wait (measured); what the slowest rank waits beyond the median rank is lost by all",
        fix=fixes.straggler(ctx.framework, slow_rank, reason),
    )
