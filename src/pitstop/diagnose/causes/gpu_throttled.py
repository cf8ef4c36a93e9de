"""gpu_throttled: a busy GPU runs below its application clock with a power or thermal reason set.

Read from NVML beside each utilization sample (``GpuSample.clock_reasons``, ``sm_clock``, ``app_clock``), per
GPU. A throttled GPU is slow by the clock ratio on the compute it does; in a multi-GPU job every other rank
waits for it at each collective, so the whole job runs at its pace. The estimate is that clock ratio applied
to the compute share of the step (measured clocks; linear scaling with clock is the assumption)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from pitstop.clock_reasons import HARDWARE_MASK, THROTTLING_MASK, reason_names
from pitstop.core.findings import Finding, use
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.remedies import advise

BUSY_UTIL = 50.0  # % utilization: samples of a GPU that is working
THROTTLED_SHARE = 0.2  # of the busy samples, with a throttling reason set
HARDWARE_SHARE = 0.1  # hardware reasons matter at a lower share
SLOW_CLOCK = 0.9  # mean busy SM clock / application clock


@dataclass
class GpuClocks:
    """One GPU's busy samples, judged."""

    busy_samples: int
    throttled_frac: float
    hardware_frac: float
    reasons: list[str]
    mean_sm_clock_mhz: float | None
    app_clock_mhz: float | None

    @property
    def clock_ratio(self) -> float | None:
        if self.mean_sm_clock_mhz is None or not self.app_clock_mhz:
            return None
        return round(self.mean_sm_clock_mhz / self.app_clock_mhz, 3)

    @property
    def throttled(self) -> bool:
        ratio = self.clock_ratio
        slow = ratio is not None and ratio <= SLOW_CLOCK
        return (self.throttled_frac >= THROTTLED_SHARE and (slow or ratio is None)) or (
            self.hardware_frac >= HARDWARE_SHARE and slow
        )

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "clock_ratio": self.clock_ratio}


def per_gpu_clocks(ctx: RuleContext) -> dict[int, GpuClocks]:
    """Each rank's GPU, judged on its busy samples (ranks without clock readings are left out)."""
    gpus: dict[int, GpuClocks] = {}
    for rank in ctx.profile.ranks:
        busy = [s for s in rank.gpu_samples if (s.util or 0.0) >= BUSY_UTIL and s.clock_reasons is not None]
        if not busy:
            continue
        masks = [s.clock_reasons or 0 for s in busy]
        clocks = [s.sm_clock for s in busy if s.sm_clock]
        apps = [s.app_clock for s in busy if s.app_clock]
        mask = 0
        for m in masks:
            mask |= m & THROTTLING_MASK
        gpus[rank.rank] = GpuClocks(
            busy_samples=len(busy),
            throttled_frac=round(sum(1 for m in masks if m & THROTTLING_MASK) / len(busy), 3),
            hardware_frac=round(sum(1 for m in masks if m & HARDWARE_MASK) / len(busy), 3),
            reasons=reason_names(mask),
            mean_sm_clock_mhz=round(statistics.fmean(clocks)) if clocks else None,
            app_clock_mhz=round(statistics.fmean(apps)) if apps else None,
        )
    return gpus


@cause(
    CauseId.GPU_THROTTLED,
    title="A GPU runs below its clock",
    because=(
        "a busy GPU is held below its application clock by a power cap or thermal / hardware slowdown (and "
        "in a multi-GPU job the others wait for it)"
    ),
    needs_gpu=True,
    needs=(Evidence.GPU_CLOCKS,),
    fires_when=(
        "NVML clock-event reasons (power cap, thermal, HW slowdown) in ≥ {THROTTLED_SHARE:.0%} of busy "
        "samples with the SM clock ≤ {SLOW_CLOCK:.0%} of the application clock, per GPU"
    ),
    estimate="compute share × application clock / measured clock",
    remedies=(RemedyId.UNTHROTTLE_GPU,),
)
def gpu_throttled(ctx: RuleContext) -> Finding | None:
    if not ctx.on_gpu:
        return None
    gpus = per_gpu_clocks(ctx)
    slow = {r: g for r, g in gpus.items() if g.throttled}
    if not slow:
        return None
    rank, worst = min(slow.items(), key=lambda kv: kv[1].clock_ratio or 1.0)
    ratio = worst.clock_ratio
    est = amdahl(ctx.compute_frac, 1 / ratio) if ratio else None
    reasons = ", ".join(worst.reasons) or "throttling"
    many = len(gpus) > 1
    summary = (
        f"The GPU of rank {rank} is throttled ({reasons}) in {worst.throttled_frac:.0%} of its busy samples"
        + (
            f", running at {worst.mean_sm_clock_mhz:.0f} MHz against its {worst.app_clock_mhz:.0f} MHz application clock"
            if ratio
            else ""
        )
        + (
            f"; {len(slow)} of {len(gpus)} GPUs throttle, and the others wait for the slowest at each step"
            if many
            else ""
        )
        + "."
    )
    return Finding(
        cause=CauseId.GPU_THROTTLED,
        severity=severity_for(1 - (ratio or 1.0), 0.2, 0.08),
        confidence=0.85 if ratio else 0.6,
        summary=summary,
        evidence={
            "throttled_ranks": sorted(slow),
            "gpus": {str(r): g.to_dict() for r, g in sorted(gpus.items())},
        },
        est_speedup=est,
        speedup_basis=(
            "measured mean busy SM clock against the application clock, applied to the step's compute share "
            "(compute time taken as inversely proportional to the clock)"
            if est is not None
            else "no application clock read: the slowdown is not estimated"
        ),
        fix=advise(
            ctx.framework, use(RemedyId.UNTHROTTLE_GPU, reasons=list(worst.reasons), rank=rank, many=many)
        ),
    )
