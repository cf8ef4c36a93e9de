"""Host-to-device copies from pageable memory: the loader does not pin its batches, so each copy is
staged and synchronous."""

from __future__ import annotations

from pitstop.core.findings import Finding, use
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.remedies import advise


@cause(
    CauseId.PAGEABLE_COPIES,
    title="Host-to-device copies from pageable memory",
    because="host-to-device copies come from pageable memory (pin_memory=False)",
    needs_gpu=True,
    needs=((Evidence.TRACE_KERNELS, Evidence.SETTINGS),),
    fires_when="`pin_memory=False` for batches copied to the GPU",
    estimate="bytes per step at pageable vs pinned PCIe rates",
    remedies=(RemedyId.WORKERS, RemedyId.PIN_MEMORY),
)
def pageable_copies(ctx: RuleContext) -> Finding | None:
    if not ctx.on_gpu:
        return None
    traced = ctx.trace_mean(lambda t: t.h2d_pageable_mb)
    step = ctx.metrics.step_time_s
    if traced is not None:
        if traced <= 0 or not step:
            return None
        bytes_per_step = traced * 1e6
        basis_source = "pageable host-to-device copies in the trace"
    else:
        dl = ctx.env.dataloader
        # pinned memory overlaps nothing when the copy blocks (non_blocking=False, HF's default): such a
        # copy is as exposed as a pageable one
        blocking_pinned = bool(dl.h2d_copies_pinned_blocking) and not dl.h2d_copies_non_blocking
        if dl.pin_memory is not False and not blocking_pinned:
            return None
        steps = [s for r in ctx.profile.ranks for s in r.steps if s.h2d_bytes]
        if not steps or not step:
            return None
        bytes_per_step = sum(s.h2d_bytes or 0 for s in steps) / len(steps)
        basis_source = (
            "batch bytes copied from pinned memory with non_blocking=False"
            if blocking_pinned and dl.pin_memory is not False
            else "batch bytes with pin_memory=False"
        )
    gpu = ctx.gpu
    link = (gpu.pcie_gbps if gpu else 31.5) * 1e9
    # a pageable copy is staged through a bounce buffer (about half the pinned rate) and blocks the host
    lost = bytes_per_step / (0.4 * link) - bytes_per_step / (0.8 * link)
    frac = min(lost / step, 0.9)
    return Finding(
        cause=CauseId.PAGEABLE_COPIES,
        severity=severity_for(frac, 0.10, 0.02),
        confidence=0.7 if traced is not None else 0.6,
        summary=(
            f"Host-to-device copies cannot overlap compute ({basis_source}): {bytes_per_step / 1e6:.2f} MB per step."
        ),
        evidence={
            "pin_memory": ctx.env.dataloader.pin_memory,
            "h2d_copies_pinned_blocking": ctx.env.dataloader.h2d_copies_pinned_blocking,
            "h2d_copies_non_blocking": ctx.env.dataloader.h2d_copies_non_blocking,
            "h2d_pageable_mb_per_step": round(bytes_per_step / 1e6, 3),
            "est_copy_ms_lost": round(lost * 1000, 3),
        },
        est_speedup=amdahl(frac, float("inf")),
        speedup_basis=f"{basis_source}, at ~40% (pageable) vs ~80% (pinned) of the PCIe link rate",
        fix=advise(ctx.framework, use(RemedyId.PIN_MEMORY)),
    )
