"""needless_recompute: activation checkpointing on while the activations would fit without it.

Checkpointing trades compute for memory: each layer's forward runs again inside the backward pass. That is
worth it only where memory is short. The planner's memory model (the same one `pitstop plan` uses) tells
whether the run fits without it at its micro-batch; a measured run shows what the recomputation costs (the
backward carries one more forward: the recomputed share is about the forward's own).
"""

from __future__ import annotations

from pitstop.diagnose.context import RuleContext, amdahl
from pitstop.findings import Finding
from pitstop.plan.from_run import has_shape, setup_for_run
from pitstop.plan.memory import memory
from pitstop.remedies import RemedyId, advise, use
from pitstop.vocabulary import Severity

GIB = 1024**3
FIT_SHARE = 0.9  # the plan without checkpointing must stay under this share of the GPU's memory


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
    elif ctx.env.device == "cpu":
        basis = "a CPU run: activations live in host memory"
        confidence = 0.6
    elif m.gpu_mem_used_frac is not None and m.gpu_mem_used_frac < 0.5:
        evidence["gpu_mem_used_frac"] = round(m.gpu_mem_used_frac, 3)
        basis = f"only {m.gpu_mem_used_frac:.0%} of GPU memory is used with it on (measured)"
        confidence = 0.5
    else:
        return None  # nothing says the activations would fit
    est = None
    speed_basis = "configuration only: the recomputed forward was not timed"
    if m.forward_frac is not None and m.backward_frac is not None:
        evidence["forward_frac"] = round(m.forward_frac, 3)
        evidence["backward_frac"] = round(m.backward_frac, 3)
        est = amdahl(m.forward_frac, float("inf"))
        speed_basis = (
            f"the forward takes {m.forward_frac:.0%} of the step (measured); checkpointing runs it once more "
            "inside the backward, so turning it off saves about that share"
        )
    return Finding(
        cause="needless_recompute",
        severity=Severity.MEDIUM if est is not None and est >= 1.15 else Severity.LOW,
        confidence=confidence,
        summary=f"Activation checkpointing recomputes every layer's forward in the backward pass, yet {basis}.",
        evidence=evidence,
        est_speedup=est,
        speedup_basis=speed_basis,
        fix=advise(ctx.framework, use(RemedyId.NO_CHECKPOINTING, basis=basis)),
    )
