"""oversharded: ZeRO-3 / FSDP FULL_SHARD where a lighter strategy fits, or across nodes without a hybrid.

ZeRO-3 and FULL_SHARD buy memory with traffic: the weights are gathered for the forward and again for the
backward, 3(n−1)/n of the parameter bytes a step against DDP's or ZeRO-2's 2(n−1)/n. Where the planner (the
model `pitstop plan` uses) says ZeRO-2 / SHARD_GRAD_OP fits the GPU, the third pass is paid for nothing.
Across nodes every gather of FULL_SHARD runs at the network's rate; HYBRID_SHARD (or DeepSpeed ZeRO++ hpZ)
keeps the gathers inside the node and sends only gradients across. The extra bytes and seconds come from
``plan.comm``, labelled as an estimate: overlap may hide part of them. Where even plain DDP fits and the
sharding's measured cost is material, ``sharding_overhead`` names the same seconds with the bigger fix, and
this rule stays silent."""

from __future__ import annotations

from dataclasses import replace

from pitstop.core.findings import Finding, use
from pitstop.core.vocabulary import CauseId, Device, Evidence, RemedyId, Sharding
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.hardware import GpuSpec, lookup_gpu
from pitstop.interconnect import transport
from pitstop.plan.comm import CommPlan, backward_share, setup_comm, strategy_of
from pitstop.plan.flops import flops_per_token
from pitstop.plan.from_run import has_shape, setup_for_run
from pitstop.plan.memory import GIB, Setup, memory, model_states
from pitstop.remedies import advise

FIT_SHARE = 0.9  # the lighter strategy's whole step must stay under this share of the GPU's memory
STATES_SHARE = 0.6  # without the model's shape: its model states under this share (as offload_bound)
HEAVY = ("full_shard", "zero3_hpz", "hybrid_shard")
MID_MFU = 0.45


def _lighter(s: Setup) -> Setup:
    """The same job with gradients and optimizer sharded but weights kept between forward and backward."""
    if s.sharding == Sharding.HYBRID_SHARD:
        return replace(s, zero=2, sharding=str(Sharding.HYBRID_SHARD_ZERO2), hpz=1)
    return replace(s, zero=2, sharding=str(Sharding.SHARD_GRAD_OP) if s.sharding else None, hpz=1)


def _hybrid(s: Setup) -> Setup:
    """The same job sharded inside each node: HYBRID_SHARD for FSDP, ZeRO++ hpZ for DeepSpeed."""
    if s.sharding:
        return replace(s, sharding=str(Sharding.HYBRID_SHARD))
    return replace(s, hpz=max(s.gpus // s.nodes, 1))


def planned_peak(s: Setup, gpu_bytes: float) -> tuple[float, float]:
    """(bytes per GPU, the share of the GPU it may take): the whole step when the shape is known, else the
    model states alone."""
    if has_shape(s):
        return memory(s, gpu_bytes).total, FIT_SHARE
    return sum(model_states(s)[:3]), STATES_SHARE


def _choice(s: Setup, gpu_bytes: float) -> tuple[str, Setup, dict[str, float]] | None:
    """Why the run is oversharded and the setup it should run instead, with the planner's GiB per GPU."""
    gib = {strategy_of(s.zero, s.sharding, s.hpz): planned_peak(s, gpu_bytes)[0] / GIB}
    lighter = _lighter(s)
    need, share = planned_peak(lighter, gpu_bytes)
    gib[strategy_of(lighter.zero, lighter.sharding)] = need / GIB
    if need <= share * gpu_bytes:
        return "lighter_fits", lighter, gib
    if s.nodes > 1 and strategy_of(s.zero, s.sharding, s.hpz) == "full_shard":
        hybrid = _hybrid(s)
        need, share = planned_peak(hybrid, gpu_bytes)
        gib[strategy_of(hybrid.zero, hybrid.sharding, hybrid.hpz)] = need / GIB
        if need <= share * gpu_bytes:
            return "spans_nodes", hybrid, gib
    return None


def _gb(n: float) -> float:
    return round(n / 1e9, 3)


def _network(cp: CommPlan) -> float:
    return cp.network_bytes


def _step_s(ctx: RuleContext, s: Setup, gpu: GpuSpec, now: CommPlan) -> tuple[float, str] | None:
    """The step time the saving is set against: measured, or the planner's compute plus its communication."""
    if ctx.metrics.step_time_s:
        return ctx.metrics.step_time_s, "measured step"
    fpt = flops_per_token(ctx.env.model, float(s.seq)) if s.seq else None
    peak = gpu.peak_flops("bf16") or gpu.peak_flops("fp32")
    if fpt is None or not peak:
        return None
    a = max(ctx.env.grad_accum_steps or 1, 1)
    compute = s.micro_batch * s.seq * a * fpt.total / (peak * MID_MFU)
    return compute + now.seconds, "planned step (compute at 45% MFU + its communication, none hidden)"


@cause(
    CauseId.OVERSHARDED,
    title="Sharded more than memory needs",
    because=(
        "multi-GPU: ZeRO-3 / FSDP FULL_SHARD gathers the weights twice per step although a lighter "
        "strategy (ZeRO-2, SHARD_GRAD_OP) fits, or spans nodes without HYBRID_SHARD / ZeRO++ hpZ, so every "
        "gather crosses the slower network"
    ),
    needs_gpu=True,
    needs=(Evidence.SETTINGS,),
    fires_when=(
        "ZeRO-3 / FSDP `FULL_SHARD` (or `HYBRID_SHARD`) on ≥ 2 GPUs while the planner says ZeRO-2 / "
        "`SHARD_GRAD_OP` (`HYBRID_SHARD_ZERO2`) fits under {FIT_SHARE:.0%} of the GPU (model states under "
        "{STATES_SHARE:.0%} when the shape is unknown); or `FULL_SHARD` across nodes without "
        "`HYBRID_SHARD` / ZeRO++ hpZ while the hybrid fits"
    ),
    estimate=(
        "plan/comm's extra communication seconds per step at 80% of the links, over the measured step (at "
        "most half of it, or the measured exposed communication when collectives were timed) or the "
        "planned one"
    ),
    remedies=(RemedyId.LIGHTER_SHARDING,),
    reads_findings=True,  # defers to sharding_overhead: plain DDP, where it fits, removes the third pass too
)
def oversharded(ctx: RuleContext) -> Finding | None:
    if any(f.cause == CauseId.SHARDING_OVERHEAD for f in ctx.earlier):
        return None  # the same seconds, measured there, with the bigger fix
    env = ctx.env
    world = ctx.profile.world_size
    gpu = lookup_gpu(env.gpu_name)
    if world < 2 or not ctx.gpu_possible or gpu is None:
        return None
    seq = round(ctx.metrics.seq_len or env.max_seq_len or 0)
    s = setup_for_run(env, seq=seq, gpus=world)
    if s is None or strategy_of(s.zero, s.sharding, s.hpz) not in HEAVY:
        return None
    gpu_bytes = float(env.gpu_memory_bytes or gpu.memory_bytes)
    choice = _choice(s, gpu_bytes)
    if choice is None:
        return None
    reason, better, gib = choice
    link = transport(env.dist_backend, env.device or Device.CUDA, env.gpu_name, s.nodes, env.comm_env).link
    a = max(env.grad_accum_steps or 1, 1)
    now = setup_comm(s, gpu, s.nodes, link if s.nodes > 1 else None, a)
    after = setup_comm(better, gpu, s.nodes, link if s.nodes > 1 else None, a)
    if now.seconds <= after.seconds:
        return None
    return _finding(ctx, s, better, reason, gib, gpu, (now, after))


def _evidence(
    ctx: RuleContext,
    s: Setup,
    names: tuple[str, str],
    reason: str,
    gib: dict[str, float],
    gpu: GpuSpec,
    comm: tuple[CommPlan, CommPlan],
) -> dict[str, object]:
    """The run's sharding facts, the planner's memory per GPU under each option and plan/comm's traffic."""
    (current, target), (now, after) = names, comm
    extra_s = now.seconds - after.seconds
    evidence: dict[str, object] = {
        "strategy": current,
        "zero_stage": ctx.env.zero_stage,
        "fsdp_sharding": ctx.env.fsdp_sharding,
        "zero_hpz": ctx.env.zero_hpz,
        "world_size": s.gpus,
        "nodes": s.nodes,
        "reason": reason,
        "suggested": target,
        "plan_gib_per_gpu": {k: round(v, 2) for k, v in gib.items()},
        "gpu_gib": round(float(ctx.env.gpu_memory_bytes or gpu.memory_bytes) / GIB, 1),
        "fit_basis": "whole step (planner)" if has_shape(s) else "model states only (shape unknown)",
        "links": sorted({c.link.key for c in now.collectives}),
        "gb_on_the_bus_per_step_est": {current: _gb(now.bus_bytes), target: _gb(after.bus_bytes)},
        "comm_s_per_step_est": {current: round(now.seconds, 4), target: round(after.seconds, 4)},
        "extra_comm_s_per_step_est": round(extra_s, 4),
    }
    if s.nodes > 1:
        evidence["network_gb_per_step_est"] = {current: _gb(_network(now)), target: _gb(_network(after))}
    return evidence


def _finding(
    ctx: RuleContext,
    s: Setup,
    better: Setup,
    reason: str,
    gib: dict[str, float],
    gpu: GpuSpec,
    comm: tuple[CommPlan, CommPlan],
) -> Finding:
    now, after = comm
    extra_s = now.seconds - after.seconds
    current, target = (
        strategy_of(s.zero, s.sharding, s.hpz),
        strategy_of(better.zero, better.sharding, better.hpz),
    )
    evidence = _evidence(ctx, s, (current, target), reason, gib, gpu, (now, after))
    saved = min(extra_s, 0.5 * (ctx.metrics.step_time_s or float("inf")))  # exposure not timed: half a step
    if ctx.ranks is not None:  # what overlap hides is not lost: cap by the measured exposed communication
        exposed = sum(r.comm_s for r in ctx.ranks.ranks) / max(len(ctx.ranks.ranks), 1)
        evidence["exposed_comm_s_per_step"] = round(exposed, 4)
        saved = min(saved, exposed)
    est, basis = None, "estimate not possible: neither a measured step nor the model's FLOPs"
    step = _step_s(ctx, s, gpu, now)
    if step is not None:
        frac = min(saved / step[0], 0.9)
        est = amdahl(frac, float("inf"))
        basis = (
            f"estimate: plan/comm puts {extra_s:.3f} s more communication in each step ({current}: "
            f"{now.seconds:.3f} s, {target}: {after.seconds:.3f} s at 80% of the links) against the {step[1]} of "
            f"{step[0]:.3f} s; overlap with the backward (~{backward_share(s):.0%} of compute) can hide part of it"
            + (
                ""
                if ctx.ranks is not None
                else "; at most half the step counted, as its exposure was not timed"
            )
        )
    if reason == "lighter_fits":
        where = f"{target} fits ({gib[target]:.1f} GiB per GPU by the planner)"
        moved = (
            f"about {(now.bus_bytes - after.bus_bytes) / 1e9:.1f} GB more per step through each GPU's link"
        )
    else:
        where = (
            f"it spans {s.nodes} nodes and every gather crosses the network; {target} keeps them in a node"
        )
        moved = f"{_network(now) / 1e9:.1f} GB per GPU cross the network each step instead of {_network(after) / 1e9:.1f}"
    return Finding(
        cause=CauseId.OVERSHARDED,
        severity=severity_for(saved / step[0] if step else 0.0, 0.25, 0.10),
        confidence=0.7 if ctx.measured else 0.6,
        summary=(
            f"The run shards with {current} over {s.gpus} GPUs, yet {where}: {moved} ({extra_s:.2f} s more "
            "communication, estimated)."
        ),
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=advise(
            ctx.framework,
            use(
                RemedyId.LIGHTER_SHARDING,
                current=current,
                target=target,
                deepspeed=s.sharding is None,
                gpus_per_node=max(s.gpus // s.nodes, 1),
                saved_s=round(extra_s, 3),
            ),
        ),
    )
