"""needless_recompute: activation checkpointing on while the activations would fit without it.

Checkpointing trades compute for memory: each layer's forward runs again inside the backward pass. That is
worth it only where memory is short. The planner's memory model (the same one `pitstop plan` uses) tells
whether the run fits without it at its micro-batch; a measured run bounds what the recomputation costs.

The estimate, from the physics of the fix: with checkpointing the measured backward B holds the backward proper
and the recompute R, which is the checkpointed blocks' forward once more — never the whole forward F (the
embeddings, the head, the loss and whatever the loop computes before ``backward`` are not recomputed). A
layer's backward costs about twice its forward (two matmuls for each of the forward's), so B ≈ 2F + R and
R ≈ B − 2F, bounded by 0 ≤ R ≤ F and R ≤ B/3 (all of the forward checkpointed). Turning checkpointing off
saves R. The ratio 2 is assumed, not measured: the confidence says so. (Issue 27: "the forward is 47% of the
step" gave ×1.89 where tune measured ×0.97; B − 2F gives ×1.00.)"""

from __future__ import annotations

from pitstop.core.findings import Finding, use
from pitstop.core.vocabulary import CauseId, Device, Evidence, RemedyId, Severity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl
from pitstop.plan.from_run import has_shape, setup_for_run
from pitstop.plan.memory import memory
from pitstop.remedies import advise

GIB = 1024**3
FIT_SHARE = 0.9  # the plan without checkpointing must stay under this share of the GPU's memory
BACKWARD_PER_FORWARD = 2.0  # a layer's backward over its forward: two matmuls per forward matmul
ASSUMED_RATIO = 0.75  # confidence kept when the recompute rests on that ratio rather than a timing
UNMEASURED = 0.6  # confidence kept when nothing timed the forward and backward


def recompute_share(forward: float, backward: float) -> float:
    """The share of the step the recompute takes, from the measured forward and backward shares of a
    checkpointed step: B − 2F, at least 0, at most F (only the forward can be run again) and B/3 (every
    block checkpointed: B = 2F + F)."""
    return min(max(backward - BACKWARD_PER_FORWARD * forward, 0.0), forward, backward / 3.0)


def _planned_fit(ctx: RuleContext) -> tuple[float, float, float] | None:
    """(peak with checkpointing, peak without, GPU bytes) from the planner, when it can size the run."""
    seq = ctx.metrics.seq_len or ctx.env.max_seq_len
    gpu_bytes = ctx.env.gpu_memory_bytes or (ctx.gpu.memory_gib * GIB if ctx.gpu else None)
    setup = setup_for_run(ctx.env, seq=round(seq or 0), gpus=ctx.profile.world_size)
    if setup is None or not has_shape(setup) or not gpu_bytes or not ctx.env.micro_batch_size:
        return None
    from dataclasses import replace

    with_ckpt = memory(replace(setup, checkpointing=True), gpu_bytes).total
    without = memory(replace(setup, checkpointing=False), gpu_bytes).total
    return with_ckpt, without, gpu_bytes


@cause(
    CauseId.NEEDLESS_RECOMPUTE,
    title="Activations recomputed that would fit",
    because=(
        "activation checkpointing re-runs the forward pass inside the backward while the activations would "
        "fit in memory without it"
    ),
    needs_gpu=False,
    needs=(Evidence.SETTINGS,),
    fires_when=(
        "activation checkpointing on while the planner says the run fits without it under {FIT_SHARE:.0%} "
        "of the GPU (or a CPU run, or < 50% GPU memory used)"
    ),
    estimate=(
        "recompute ≈ measured backward − {BACKWARD_PER_FORWARD:.0f} × forward of the checkpointed step "
        "(the ratio assumed, so confidence is lowered), at most the forward and a third of the backward"
    ),
    remedies=(RemedyId.NO_CHECKPOINTING,),
)
def needless_recompute(ctx: RuleContext) -> Finding | None:
    if not ctx.env.gradient_checkpointing:
        return None
    m = ctx.metrics
    evidence: dict[str, object] = {
        "gradient_checkpointing": True,
        "micro_batch_size": ctx.env.micro_batch_size,
    }
    planned = _planned_fit(ctx) if ctx.gpu_possible else None
    if planned is not None:
        with_ckpt, without, gpu_bytes = planned
        evidence.update(
            plan_peak_gib_with_checkpointing=round(with_ckpt / GIB, 2),
            plan_peak_gib_without=round(without / GIB, 2),
            gpu_gib=round(gpu_bytes / GIB, 2),
        )
        if without > FIT_SHARE * gpu_bytes:
            return None  # checkpointing is what makes it fit: not needless
        basis = f"the planner puts the peak without checkpointing at {without / GIB:.1f} GiB of {gpu_bytes / GIB:.0f} GiB"
        confidence = 0.8
    elif ctx.env.device == Device.CPU:
        basis = "a CPU run: activations live in host memory"
        confidence = 0.6
    elif m.gpu_mem_used_frac is not None and m.gpu_mem_used_frac < 0.5:
        evidence["gpu_mem_used_frac"] = round(m.gpu_mem_used_frac, 3)
        basis = f"only {m.gpu_mem_used_frac:.0%} of GPU memory is used with it on (measured)"
        confidence = 0.5
    else:
        return None  # nothing says the activations would fit
    est, speed_basis, confidence = _estimate(m.forward_frac, m.backward_frac, evidence, confidence)
    return Finding(
        cause=CauseId.NEEDLESS_RECOMPUTE,
        severity=Severity.MEDIUM if est is not None and est >= 1.15 else Severity.LOW,
        confidence=confidence,
        summary=f"Activation checkpointing recomputes every layer's forward in the backward pass, yet {basis}.",
        evidence=evidence,
        est_speedup=est,
        speedup_basis=speed_basis,
        fix=advise(ctx.framework, use(RemedyId.NO_CHECKPOINTING, basis=basis)),
    )


def _estimate(
    forward: float | None, backward: float | None, evidence: dict[str, object], confidence: float
) -> tuple[float | None, str, float]:
    """The speed-up of turning checkpointing off, its basis, and the confidence left for it."""
    if forward is None or backward is None:
        return None, "configuration only: the forward and backward were not timed", confidence * UNMEASURED
    recompute = recompute_share(forward, backward)
    evidence.update(
        forward_frac=round(forward, 3),
        backward_frac=round(backward, 3),
        recompute_frac_est=round(recompute, 3),
    )
    basis = (
        f"the backward takes {backward:.0%} of the step and the forward {forward:.0%} (measured); a backward "
        f"proper costs about {BACKWARD_PER_FORWARD:.0f}× its forward, so the recompute is about backward − "
        f"{BACKWARD_PER_FORWARD:.0f}×forward = {recompute:.0%} of the step (at most the forward, at most a third "
        "of the backward; the ratio is assumed, not timed)"
    )
    if recompute <= 0.0:
        basis += ": the step split shows no time for a recompute"
    return amdahl(recompute, float("inf")), basis, confidence * ASSUMED_RATIO
