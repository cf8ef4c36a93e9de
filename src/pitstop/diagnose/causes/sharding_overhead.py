"""sharding_overhead: ZeRO or FSDP on a model whose full replica fits, paying the sharding's per-module work.

Sharding (ZeRO-1/2/3, FSDP of any strategy) buys memory. Where the planner (the model `pitstop plan` uses)
says plain DDP, a full replica of the weights, gradients and optimizer states plus the activations, fits the
device, that memory is not needed, and the sharding still costs every step: its hooks run before and after
each unit's forward and backward (FSDP) or each module and parameter (ZeRO-3's fetch and release, ZeRO's
per-parameter gradient hooks), and each unit or bucket issues its own all-gather and reduce-scatter, where
DDP's reducer all-reduces the gradients in a few 25 MB buckets. On a model of many small tensors (norms,
biases, small layers) the per-call work dominates: measured on two gloo ranks with 64 small blocks each its
own FSDP unit, 194 collectives a step against DDP's one bucket, and a step 5-10× slower than DDP's.

The probe times the hooks (``RankProfile.sharding``: ``probe/collectors/sharding.py``) and every collective;
the rule sets the larger of the hooks' time and the exposed communication against DDP's all-reduce of the
same gradients from ``plan.comm`` at the job's link; where no link is known (gloo) each of DDP's buckets costs
what one of the job's own collectives cost once every rank had arrived, and its bytes move at an assumed TCP
rate (a job of many small collectives is mostly latency: its bytes over its whole time would price DDP's few
buckets far too high). ZeRO-3 / FULL_SHARD's third pass alone is ``oversharded``'s argument (it defers to this finding, whose
fix removes it too); the all-gathers a reentrant checkpoint repeats are ``reentrant_checkpointing``'s and are
left out of the seconds here."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from pitstop.core.findings import Finding, use
from pitstop.core.profile import RankProfile, ShardingStats
from pitstop.core.vocabulary import CauseId, Device, Evidence, RemedyId, Sharding
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.causes.oversharded import FIT_SHARE, STATES_SHARE, planned_peak
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.diagnose.ranks import bus_factor
from pitstop.hardware import lookup_gpu
from pitstop.interconnect import LINKS, transport
from pitstop.plan.comm import comm_per_step, intra_link, model_bytes, strategy_of
from pitstop.plan.from_run import has_shape, setup_for_run
from pitstop.plan.memory import GIB, MIB, Setup
from pitstop.remedies import advise

MIN_SHARE = 0.10  # the overhead beyond DDP's all-reduce must be at least this share of the step
HOOKS_CONFIDENCE = 0.75  # the hooks were timed; DDP's cost is modelled, not measured
COMM_CONFIDENCE = 0.6  # only the exposed communication was timed (the hooks were not seen)
DDP_FIRST_BUCKET = 1 * MIB  # DDP's first gradient bucket (torch's _DEFAULT_FIRST_BUCKET_BYTES)
DDP_BUCKET = 25 * MIB  # DDP's bucket_cap_mb default
HOST_TCP_RATE = 1e9  # gloo on one host, no link known: TCP moves more, so DDP's cost is an upper bound
FIT_SHARE = FIT_SHARE  # DDP's whole step must stay under this share of the device (oversharded's convention)
STATES_SHARE = STATES_SHARE  # without the model's shape: DDP's model states under this share


@dataclass(frozen=True)
class Measured:
    """Per step, means over the ranks that reported: what the sharded run spent and did."""

    step_s: float
    hook_s: float | None
    comm_s: float | None
    collectives: float | None
    regather_s: float  # the all-gathers a reentrant recompute repeats: reentrant_checkpointing's seconds
    stats: ShardingStats | None

    @property
    def cost_s(self) -> float:
        """The larger of the hooks' time (their waits for collectives included) and the exposed
        communication: the two overlap where a hook waits for its own all-gather."""
        return max(self.hook_s or 0.0, self.comm_s or 0.0)


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _regather_s(rank: RankProfile) -> float:
    """Seconds a step of reentrant recomputes' repeated all-gathers: counted × the window's median all-gather."""
    ck = rank.checkpointing
    if ck is None or not ck.regathers or not rank.steps:
        return 0.0
    first, last = rank.steps[0].index, rank.steps[-1].index
    times = [
        c.done_t - c.issued_t if c.done_t is not None else (c.blocked_s or 0.0)
        for c in rank.collectives
        if c.op == "all_gather" and first <= c.step <= last
    ]
    return ck.regathers / len(rank.steps) * statistics.median(times) if times else 0.0


def _measured(ctx: RuleContext) -> Measured | None:
    ranks = [r for r in ctx.profile.ranks if r.steps]
    if not ranks:
        return None
    stats = next((r.sharding for r in ranks if r.sharding is not None), None)
    hooks = [r.sharding.hook_s / len(r.steps) for r in ranks if r.sharding and r.sharding.hook_s is not None]
    comm = [r.comm_s for r in ctx.ranks.ranks] if ctx.ranks is not None else []
    counts = [s.collectives for r in ranks for s in r.steps if s.collectives is not None]
    step = _mean([r.mean_step_s or 0.0 for r in ranks]) or 0.0
    if step <= 0 or not (hooks or comm):
        return None
    return Measured(
        step_s=step,
        hook_s=_mean(hooks),
        comm_s=_mean(comm),
        collectives=_mean([float(c) for c in counts]),
        regather_s=_mean([_regather_s(r) for r in ranks]) or 0.0,
        stats=stats,
    )


def _strategy(ctx: RuleContext, stats: ShardingStats | None) -> str | None:
    """The sharding in use, as plan/comm names it; None when the job does not shard."""
    env = ctx.env
    fsdp = Sharding.parse(env.fsdp_sharding) if env.fsdp_sharding else None
    if fsdp is not None:
        return None if fsdp == Sharding.NO_SHARD else str(fsdp)
    if env.zero_stage:
        return strategy_of(env.zero_stage, None, env.zero_hpz or 1)
    if stats is not None and stats.strategy and stats.strategy != Sharding.NO_SHARD:
        return stats.strategy
    return None


def _memory_bytes(ctx: RuleContext, stats: ShardingStats | None) -> float | None:
    gpu = lookup_gpu(ctx.env.gpu_name)
    found = ctx.env.gpu_memory_bytes or (gpu.memory_bytes if gpu else None)
    found = found or (stats.memory_bytes if stats else None)
    return float(found) if found else None


@dataclass(frozen=True)
class DdpCost:
    """DDP's all-reduce of the same gradients, per step, and the words that say how it was costed."""

    seconds: float
    link: str  # what it was costed at: "plan/comm's link", or the job's own collectives' latency and rate
    modelled_by_plan: bool  # plan/comm at a known link; False: the job's own per-call cost (gloo, no GPU)


def _own_call_s(ctx: RuleContext) -> float | None:
    """What one of the job's collectives costs once every rank has arrived (its exposed time per call, waits
    for a late rank left out): on gloo a sharded job's calls are small, so this is mostly their latency."""
    ranks = [r for r in ctx.ranks.ranks if r.collectives_per_step > 0] if ctx.ranks is not None else []
    return statistics.fmean(r.comm_s / r.collectives_per_step for r in ranks) if ranks else None


def _ddp_cost(ctx: RuleContext, s: Setup, grad_bytes: float, world: int) -> DdpCost | None:
    """DDP's all-reduce at the GPU's link (plan/comm's model); without one, each bucket at the job's own cost
    of a collective plus the gradients' bus bytes at an assumed TCP rate."""
    env = ctx.env
    gpu = lookup_gpu(env.gpu_name)
    link = transport(env.dist_backend, env.device or Device.CUDA, env.gpu_name, s.nodes, env.comm_env).link
    if gpu is not None and env.device != Device.CPU and link is not None:
        wide = link if s.nodes > 1 else intra_link(gpu)
        plan = comm_per_step("no_shard", 0.0, grad_bytes, world, s.nodes, wide, wide)
        return DdpCost(plan.seconds, "plan/comm's link", True)
    per_call = _own_call_s(ctx)
    if per_call is None:
        return None
    one_host = s.nodes <= 1
    rate = HOST_TCP_RATE if one_host else LINKS["eth10"].gbps * 1e9
    buckets = ddp_buckets(grad_bytes)
    seconds = buckets * per_call + grad_bytes * bus_factor("all_reduce", world) / rate
    words = (
        f"the job's own {per_call * 1e3:.2f} ms a collective (waits for a late rank left out) per bucket, the "
        f"gradients at an assumed {rate / 1e9:.2g} GB/s ({'TCP inside one host' if one_host else '10 GbE'})"
    )
    return DdpCost(seconds, words, False)


def ddp_buckets(grad_bytes: float) -> int:
    """Gradient buckets DDP fills: a 1 MB first bucket, then 25 MB each."""
    return 1 + math.ceil(max(grad_bytes - DDP_FIRST_BUCKET, 0.0) / DDP_BUCKET)


@cause(
    CauseId.SHARDING_OVERHEAD,
    title="Sharding where a full replica fits",
    because=(
        "multi-GPU: ZeRO or FSDP runs its hooks and issues an all-gather / reduce-scatter per unit, module or "
        "parameter every step, although the planner says plain DDP (a full replica) fits the device; on a "
        "model of many small tensors that per-call work costs more than DDP's few bucketed all-reduces"
    ),
    needs_gpu=False,
    needs=((Evidence.PROCESS, Evidence.SETTINGS),),
    fires_when=(
        "ZeRO-1/2/3 or FSDP (any strategy) on ≥ 2 ranks, the planner puts DDP's whole step under "
        "{FIT_SHARE:.0%} of the device's memory (model states under {STATES_SHARE:.0%} when the shape is "
        "unknown; on a CPU the host's memory over its ranks), and the measured sharding cost (the framework's "
        "hooks' time or the exposed communication, the larger) beyond DDP's modelled all-reduce is ≥ "
        "{MIN_SHARE:.0%} of the step"
    ),
    estimate=(
        "the measured cost less DDP's all-reduce of the same gradients (plan/comm at the GPU's link; without one, "
        "each bucket at the job's own exposed time per collective plus the gradients at an assumed 1 GB/s inside "
        "a host: an upper bound) and less the repeats reentrant_checkpointing "
        "names, as a share of the step, removed"
    ),
    remedies=(RemedyId.PLAIN_DDP,),
)
def sharding_overhead(ctx: RuleContext) -> Finding | None:
    world = ctx.profile.world_size
    m = _measured(ctx) if world >= 2 else None
    if m is None:
        return None
    current = _strategy(ctx, m.stats)
    seq = round(ctx.metrics.seq_len or ctx.env.max_seq_len or 0)
    s = setup_for_run(ctx.env, seq=seq, gpus=world) if current else None
    memory = _memory_bytes(ctx, m.stats)
    if s is None or memory is None:
        return None
    seen = Sharding.parse(current)
    if s.zero == 0 and seen is not None:  # a plain loop's FSDP, seen by the probe alone
        s = replace(s, zero=seen.zero_stage, sharding=str(seen))
    ddp = replace(s, zero=0, sharding=None, hpz=1, offload="none")
    ddp_need, share = planned_peak(ddp, memory)
    if ddp_need > share * memory:
        return None  # sharding is what lets it fit
    grad_bytes = float(m.stats.grad_bytes) if m.stats and m.stats.grad_bytes else model_bytes(s)[1]
    ddp_comm = _ddp_cost(ctx, s, grad_bytes, world)
    if ddp_comm is None:
        return None
    saved = m.cost_s - ddp_comm.seconds - m.regather_s
    frac = min(saved / m.step_s, 0.9)
    if frac < MIN_SHARE:
        return None
    sharded_need = planned_peak(s, memory)[0]
    return _finding(ctx, m, current or "", (s, ddp), (sharded_need, ddp_need, memory), ddp_comm)


def _finding(
    ctx: RuleContext,
    m: Measured,
    current: str,
    setups: tuple[Setup, Setup],
    gib: tuple[float, float, float],
    ddp: DdpCost,
) -> Finding:
    s, _ = setups
    _, ddp_need, memory = gib
    ddp_s = ddp.seconds
    saved = m.cost_s - ddp_s - m.regather_s
    frac = min(saved / m.step_s, 0.9)
    est = amdahl(frac, float("inf"))
    st = m.stats
    grad_bytes = float(st.grad_bytes) if st and st.grad_bytes else model_bytes(s)[1]
    buckets = ddp_buckets(grad_bytes)
    framework = st.framework if st else ("deepspeed" if ctx.env.zero_stage else "fsdp")
    evidence = _evidence(m, current, framework, s, (buckets, ddp_s, saved), gib, ddp.link)
    hooks = f"{m.hook_s * 1000:.0f} ms in {framework}'s hooks" if m.hook_s is not None else None
    comm = f"{m.comm_s * 1000:.0f} ms of exposed communication" if m.comm_s is not None else None
    spent = " and ".join(x for x in (hooks, comm) if x)
    basis = (
        f"measured: {spent} a step (the larger, {m.cost_s * 1000:.0f} ms, counted), less DDP's all-reduce of "
        f"{grad_bytes / 1e6:.1f} MB in {buckets} bucket(s) at {ddp.link} ({ddp_s * 1000:.1f} ms"
        + (", plan/comm)" if ddp.modelled_by_plan else ", an upper bound)")
        + (f", less {m.regather_s * 1000:.0f} ms of reentrant re-gathers" if m.regather_s else "")
        + f" = {frac:.0%} of the {m.step_s * 1000:.0f} ms step, removed"
    )
    tensors = (
        f"{st.param_tensors} parameter tensors ({st.small_tensors} small) in {st.units or '?'} units, "
        if st
        else ""
    )
    calls = (
        f"{m.collectives:.0f} collectives a step against DDP's {buckets} bucket(s)" if m.collectives else ""
    )
    return Finding(
        cause=CauseId.SHARDING_OVERHEAD,
        severity=severity_for(frac, 0.25, MIN_SHARE),
        confidence=HOOKS_CONFIDENCE if m.hook_s is not None else COMM_CONFIDENCE,
        summary=(
            f"The run shards with {current} over {s.gpus} ranks although a full replica fits "
            f"(DDP: {ddp_need / GIB:.3g} GiB of {memory / GIB:.0f} GiB per rank by the planner): "
            f"{tensors}{calls}; the sharding costs about {saved * 1000:.0f} ms a step more than DDP would."
        ),
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=advise(
            ctx.framework,
            use(
                RemedyId.PLAIN_DDP,
                current=current,
                deepspeed=framework == "deepspeed",
                fsdp2=framework == "fsdp2",
                ddp_gib=float(f"{ddp_need / GIB:.3g}"),
                saved_ms=round(saved * 1000, 1),
            ),
        ),
    )


def _evidence(
    m: Measured,
    current: str,
    framework: str,
    s: Setup,
    ddp: tuple[int, float, float],
    gib: tuple[float, float, float],
    link: str,
) -> dict[str, object]:
    """The sharding's measured facts beside DDP's modelled cost and the planner's memory under each."""
    buckets, ddp_s, saved = ddp
    sharded_need, ddp_need, memory = gib
    st = m.stats
    evidence: dict[str, object] = {
        "strategy": current,
        "sharded_by": framework,
        "world_size": s.gpus,
        "param_tensors": st.param_tensors if st else None,
        "small_tensors": st.small_tensors if st else None,
        "small_tensor_elements": st.small_elements if st else None,
        "units": st.units if st else None,
        "collectives_per_step": None if m.collectives is None else round(m.collectives, 1),
        "ddp_buckets_est": buckets,
        "step_ms": round(m.step_s * 1000, 2),
        "hook_ms_per_step": None if m.hook_s is None else round(m.hook_s * 1000, 2),
        "exposed_comm_ms_per_step": None if m.comm_s is None else round(m.comm_s * 1000, 2),
        "sharding_ms_per_step": round(m.cost_s * 1000, 2),
        "ddp_comm_ms_per_step_est": round(ddp_s * 1000, 3),
        "ddp_link": link,
        "saved_ms_per_step_est": round(saved * 1000, 2),
        "plan_gib_per_rank": {current: round(sharded_need / GIB, 3), "ddp": round(ddp_need / GIB, 3)},
        "memory_gib": round(memory / GIB, 1),
        "fit_basis": "whole step (planner)" if has_shape(s) else "model states only (shape unknown)",
    }
    if m.regather_s:
        evidence["reentrant_regather_ms_per_step"] = round(m.regather_s * 1000, 2)
    return evidence
