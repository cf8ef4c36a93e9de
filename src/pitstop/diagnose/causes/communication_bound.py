"""Communication not hidden behind compute: from timed collectives (who waits, what moves once the last
rank arrived) or a trace's exposed NCCL time, with the planned traffic set against the link."""

from __future__ import annotations

import statistics

from pitstop.core.findings import Finding, Use, use
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.causes.sharding_overhead import sharding_overhead
from pitstop.diagnose.causes.slow_links import TRANSPORT_FAULTS, link_limit
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.diagnose.ranks import OpBandwidth, RanksAnalysis
from pitstop.interconnect import Link, Transport
from pitstop.plan.from_run import setup_for_run
from pitstop.remedies import advise


@cause(
    CauseId.COMMUNICATION_BOUND,
    title="Communication not hidden behind compute",
    because="multi-GPU: gradient all-reduce / ZeRO gathers are not hidden behind compute",
    needs_gpu=True,
    needs=(Evidence.COLLECTIVES,),
    fires_when=(
        "ranks sit blocked ≥ 5% of a step while data moves after the last rank arrived (timed collectives "
        "live); from traces, NCCL time not overlapping compute (from some ranks' traces of a larger job only, at "
        "lower confidence: a rank's collective time alone cannot tell waiting for a late rank from transfer)"
    ),
    estimate="1/(1 − exposed share); bus bandwidth set against the link",
    remedies=(
        RemedyId.BIGGER_BUCKETS,
        RemedyId.FIX_TRANSPORT,
        RemedyId.NCCL_BACKEND,
        RemedyId.NO_SYNC_ACCUMULATION,
        RemedyId.OVERLAP_COMM,
    ),
)
def communication_bound(ctx: RuleContext) -> Finding | None:
    """Communication the ranks sit blocked in (live, timed collectives), or NCCL time that does not overlap
    compute kernels (from traces)."""
    if ctx.ranks is not None:
        return _communication_live(ctx)
    steps_ms = [(t, 1000 * (r.mean_step_s or 0.0)) for r, t in ctx.traced]
    rows = [
        (t.nccl_ms, t.nccl_overlap_frac, step)
        for t, step in steps_ms
        if t.nccl_ms and step and t.nccl_overlap_frac is not None
    ]
    if not rows:
        return None
    exposed = max(nccl * (1 - overlap) / step for nccl, overlap, step in rows)
    share = max(nccl / step for nccl, _, step in rows)
    # ranks aligned across traces: time spent waiting for a late rank is the straggler's, not the link's
    aligned = [t.exposed_comm_ms / step for t, step in steps_ms if t.exposed_comm_ms is not None and step]
    exposed = max(aligned) if aligned else exposed
    bandwidths = [t.bus_bandwidth_gbps for t in ctx.traces if t.bus_bandwidth_gbps]
    if exposed < 0.05:
        return None
    overlap = min(o for _, o, _ in rows)
    summary = (
        f"Communication kernels take {share:.0%} of a step and only {overlap:.0%} of that time overlaps "
        f"compute: {exposed:.0%} of the step waits on the interconnect."
    )
    severity, confidence = severity_for(exposed, 0.25, 0.10), TRACE_CONFIDENCE
    basis = "NCCL kernel time not covered by compute kernels (trace); hiding it gives at most 1/(1−f)"
    evidence: dict[str, object] = {
        "nccl_frac_of_step": round(share, 3),
        "nccl_overlap_frac": round(overlap, 3),
        "exposed_frac_of_step": round(exposed, 3),
        "exposed_comm_frac": round(exposed, 3),
        **({"bus_bandwidth_gbps": round(statistics.median(bandwidths), 1)} if bandwidths else {}),
    }
    alone = _ranks_alone(ctx) if not aligned else None
    if alone is not None:  # one rank of many: its collective time may be waiting for a late rank
        summary = summary.removesuffix(".") + (
            f", or on other ranks. Alone, {alone}'s trace cannot tell waiting for a late rank from transfer: "
            "give pitstop the other ranks' traces (a folder of all of them) to tell which."
        )
        confidence = ONE_RANK_CONFIDENCE  # under STRONG_EVIDENCE: at most MEDIUM
        basis += (
            "; an upper bound: part of it may be waiting for a late rank (straggler), one rank cannot say"
        )
        evidence |= {"ranks_read": len(ctx.traced), "world_size": ctx.profile.world_size}
    return Finding(
        cause=CauseId.COMMUNICATION_BOUND,
        severity=severity,
        confidence=confidence,
        summary=summary,
        evidence=evidence,
        est_speedup=amdahl(exposed, float("inf")),
        speedup_basis=basis,
        fix=advise(ctx.framework, use(RemedyId.OVERLAP_COMM, zero_stage=ctx.env.zero_stage)),
    )


TRACE_CONFIDENCE = 0.75  # NCCL kernels not overlapping compute, in the traces of every rank
# a rank's collective kernel runs from its own arrival to the last rank's: alone, waiting and transfer look alike
ONE_RANK_CONFIDENCE = 0.45  # the same from some ranks' traces of a larger job only (under 0.7: never HIGH)


def _ranks_alone(ctx: RuleContext) -> str | None:
    """The ranks read, in words ("rank 3 of 8"), when the traces are of some ranks of a larger job only;
    None when every rank's trace was read or the job had one rank."""
    world = ctx.profile.world_size
    read = sorted(r.rank for r, _ in ctx.traced)
    if world <= 1 or len(read) >= world:
        return None
    if len(read) == 1:
        return f"rank {read[0]} of {world}"
    return f"{len(read)} of {world} ranks"


def _accumulation(ctx: RuleContext, a: RanksAnalysis) -> tuple[float, float, float, bool]:
    """(micro-batches per step, collectives per step, bytes per step, whether every micro-batch all-reduces
    the gradients): at least half as many bytes again as one set of gradients in the parameters' dtype (fp32
    where unknown: a bf16 job that syncs twice a step may be missed, an fp32 one that syncs once never taken for
    one that syncs per micro-batch), or, the model's size unknown, at least one collective per micro-batch."""
    micro = (
        statistics.median(s.micro_batches for r in ctx.profile.ranks for s in r.steps) if ctx.measured else 0
    )
    per_step = statistics.fmean(r.collectives_per_step for r in a.ranks)
    bytes_per_step = statistics.fmean(r.bytes_per_step for r in a.ranks)
    params = ctx.env.model.params_trainable or ctx.env.model.params_total
    gradients = (params or 0) * GRADIENT_BYTES.get(ctx.env.param_dtype or "fp32", 4)
    no_sync = micro >= 2 and (bytes_per_step >= 1.5 * gradients if gradients else per_step >= micro)
    return micro, per_step, bytes_per_step, no_sync


def _communication_live(ctx: RuleContext) -> Finding | None:
    from pitstop.interconnect import transport

    a = ctx.ranks
    assert a is not None
    # the job's small metric collectives are metric_sync's: overlap, buckets and no_sync do not touch them
    exposed = max(0.0, a.mean_frac("comm_s") - a.mean_frac("small_comm_s"))
    moving = sum(b.transfer_s_per_step for b in a.bandwidth) / a.step_s if a.step_s > 0 else 0.0
    env = ctx.env
    micro, per_step, bytes_per_step, no_sync = _accumulation(ctx, a)
    # On a CPU the transfers and their reductions run on the cores that compute: what overlaps the backward
    # still takes its time from it. no_sync removes that time, overlapped or not; no other fix the rule
    # advises does on a CPU, so without accumulation the exposed share stands. A GPU computes meanwhile.
    cost = max(exposed, min(moving, MAX_COMM_SHARE)) if no_sync and not ctx.on_gpu else exposed
    if cost < 0.05:
        return None
    link = transport(env.dist_backend, env.device, env.gpu_name, env.nodes, env.comm_env)
    evidence: dict[str, object] = {
        "exposed_frac_of_step": round(exposed, 3),
        "exposed_ms_per_step": round(statistics.fmean(r.comm_s - r.small_comm_s for r in a.ranks) * 1000, 2),
        "moving_frac_of_step": round(moving, 3),
        "collectives_per_step": round(statistics.fmean(r.collectives_per_step for r in a.ranks), 2),
        "bytes_per_step": round(statistics.fmean(r.bytes_per_step for r in a.ranks)),
        "bandwidth": {
            b.op: {
                "algbw_gbps": None if b.algbw_gbps is None else round(b.algbw_gbps, 3),
                "busbw_gbps": None if b.busbw_gbps is None else round(b.busbw_gbps, 3),
                "mb_per_step": round(b.bytes_per_step / 1e6, 2),
            }
            for b in a.bandwidth
        },
        "transport": link.name,
        "link": None if link.link is None else link.link.key,
        "expected_busbw_gbps": None if link.link is None else round(link.link.expected_busbw_gbps, 1),
        "link_basis": link.basis,
        "backend": env.dist_backend,
    }
    evidence.update(_planned_comm(ctx, link.link))
    bw, likely = _bandwidth_and_likely(ctx, a.bandwidth, link, evidence, (bytes_per_step, per_step, no_sync))
    evidence["likely_causes"] = sorted(set(likely))
    est, basis = _comm_estimate(cost, exposed, ctx.on_gpu, micro if no_sync else 0)
    shared = (
        "" if ctx.on_gpu or cost == exposed else f"; data moves {moving:.0%} of it on the cores that compute"
    )
    return Finding(
        cause=CauseId.COMMUNICATION_BOUND,
        severity=severity_for(cost, 0.25, 0.10),
        confidence=0.8,
        summary=(
            f"Communication exposes {exposed:.0%} of each step (ranks blocked while data moves, after the "
            f"last rank arrived){shared}" + (f": {bw}." if bw else ".")
        ),
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=advise(
            ctx.framework,
            *_comm_uses(ctx, evidence, link.warnings, per_step, bytes_per_step / max(per_step, 1e-9), micro),
        ),
    )


def _bandwidth_and_likely(
    ctx: RuleContext,
    bandwidth: list[OpBandwidth],
    link: Transport,
    evidence: dict[str, object],
    traffic: tuple[float, float, bool],
) -> tuple[str, list[str]]:
    """The main collective's bandwidth against its link, in words, and the causes the evidence points at
    (``evidence`` gains what the links and the transport say)."""
    bytes_per_step, per_step, no_sync = traffic
    main = max(bandwidth, key=lambda b: b.bytes_per_step, default=None)
    limit = link_limit(ctx)  # the links themselves cap the job: slow_links says how far, this rule defers
    likely: list[str] = [] if limit is None else ["slow_links"]
    evidence.update({} if limit is None else {"slow_links": limit.reason})
    bw = ""
    if main is not None and main.busbw_gbps is not None:
        bw = f"{main.op}: {main.bytes_per_step / 1e6:.1f} MB per step at {main.busbw_gbps:.2f} GB/s bus bandwidth"
        if limit is not None:
            bw += f" on links that allow ~{limit.ceiling.busbw_gbps:.0f} GB/s ({limit.ceiling.link.key}: slow_links)"
        elif link.link is not None:
            bw += f" on a link that should give ~{link.link.expected_busbw_gbps:.0f} GB/s ({link.link.key})"
            if main.busbw_gbps < 0.5 * link.link.expected_busbw_gbps:
                likely.append("transport")
        else:
            bw += f" ({link.basis})"
    if link.warnings:
        evidence["transport_warnings"] = list(link.warnings)
        likely.append("nccl_backend" if ctx.env.dist_backend == "gloo" else "transport")
    per_call = bytes_per_step / max(per_step, 1e-9)
    # a sharded job's many small collectives are its units' gathers, not DDP's buckets: sharding_overhead's
    sharded = sharding_overhead(ctx)
    if sharded is not None:
        likely.append("sharding_overhead")
        said = "the sharding's per-unit collectives where a full replica fits (sharding_overhead)"
        bw = f"{bw}; {said}" if bw else said
    elif per_step >= 50 and per_call < 1e6:
        likely.append("bigger_buckets")
    if no_sync:
        likely.append("no_sync_accumulation")
    return bw, likely


GRADIENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp64": 8}  # a gradient's bytes, by the parameters' dtype
MAX_COMM_SHARE = 0.95  # the moving share is a sum over kinds of collective: never all of the step


def _comm_estimate(cost: float, exposed: float, on_gpu: bool, micro: float) -> tuple[float, str]:
    """What the first fix saves. ``no_sync`` on ``micro`` micro-batches drops the all-reduces of all but the
    last (their share of the communication cost); otherwise hiding the cost entirely is the bound."""
    what = (
        "timed collectives: blocked time after the last rank arrived"
        if on_gpu or cost == exposed
        else "timed collectives: the time data moves (on a CPU the transfers and reductions take the cores "
        "that compute, overlapped or not)"
    )
    if micro >= 2:
        gone = (micro - 1) / micro
        return amdahl(cost * gone, float("inf")), (
            f"{what}; all-reducing once per optimizer step instead of per micro-batch removes "
            f"{micro - 1:g} of {micro:g} of it"
        )
    return amdahl(cost, float("inf")), f"{what}; hiding it gives at most 1/(1−f)"


def _planned_comm(ctx: RuleContext, network: Link | None) -> dict[str, object]:
    """What ``pitstop plan`` predicts for this world size, sharding and link (plan/comm), when the model's
    size and the GPU are known: the same figures the plan shows, beside the measured ones."""
    from pitstop.hardware import lookup_gpu
    from pitstop.plan.comm import setup_comm, strategy_of

    env = ctx.env
    gpu = lookup_gpu(env.gpu_name)
    s = setup_for_run(env, gpus=ctx.profile.world_size)
    if gpu is None or s is None or s.gpus < 2:
        return {}
    cp = setup_comm(s, gpu, s.nodes, network if s.nodes > 1 else None, max(env.grad_accum_steps or 1, 1))
    return {
        "planned_strategy": strategy_of(s.zero, s.sharding, s.hpz),
        "planned_gb_on_the_bus_per_step": round(cp.bus_bytes / 1e9, 3),
        "planned_comm_s_per_step": round(cp.seconds, 4),
        "planned_basis": "pitstop plan's communication model (plan/comm): ring volumes at 80% of "
        + " / ".join(sorted({c.link.key for c in cp.collectives})),
    }


def _comm_uses(
    ctx: RuleContext,
    evidence: dict[str, object],
    warnings: tuple[str, ...] | list[str],
    per_step: float,
    per_call: float,
    micro: float,
) -> list[Use]:
    """The remedies for the causes the evidence points at, most specific first; overlap always applies."""
    raw = evidence.get("likely_causes")
    likely = set(raw) if isinstance(raw, list) else set()
    uses: list[Use] = []
    if "transport" in likely and evidence.get("slow_links") not in TRANSPORT_FAULTS:  # else slow_links' fix
        uses.append(use(RemedyId.FIX_TRANSPORT, warnings=list(warnings), multi_node=(ctx.env.nodes or 1) > 1))
    if "nccl_backend" in likely:
        uses.append(use(RemedyId.NCCL_BACKEND))
    if "bigger_buckets" in likely:
        uses.append(
            use(RemedyId.BIGGER_BUCKETS, per_step=round(per_step), mb_per_call=round(per_call / 1e6, 3))
        )
    if "no_sync_accumulation" in likely:
        uses.append(use(RemedyId.NO_SYNC_ACCUMULATION, micro_batches=int(micro)))
    return [*uses, use(RemedyId.OVERLAP_COMM, zero_stage=ctx.env.zero_stage)]
