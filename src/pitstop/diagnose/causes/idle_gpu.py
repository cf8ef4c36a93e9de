"""A GPU the job holds but leaves idle: visible GPUs that did no work while others computed."""

from __future__ import annotations

from pitstop.core.findings import Finding, use
from pitstop.core.vocabulary import CauseId, RemedyId, Severity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext
from pitstop.remedies import advise


@cause(
    CauseId.IDLE_GPU,
    title="A GPU of the job does nothing",
    because=("multi-GPU: one of the job's GPUs never does any work (a launcher or device-placement mistake)"),
    needs_gpu=True,
    fires_when="a GPU of the samples never works (peak ≤ 2%) while another computes ≥ 20% busy",
    estimate="GPUs / busy GPUs",
    remedies=(RemedyId.USE_EVERY_GPU,),
)
def idle_gpu(ctx: RuleContext) -> Finding | None:
    """A GPU in the samples that never worked while the others did (per GPU, from gpu_windows.py)."""
    windows = ctx.results.gpus
    if len(windows) < 2:
        return None
    idle = [w.gpu for w in windows if w.never_busy]
    busy = [w.gpu for w in windows if not w.never_busy and (w.active_util or 0.0) >= 0.20]
    if not busy or not idle:
        return None
    share = len(idle) / len(windows)
    working_then = ", ".join(f"GPU {w.gpu} {w.active_util or 0.0:.0%}" for w in windows if w.gpu in busy)
    return Finding(
        cause=CauseId.IDLE_GPU,
        severity=Severity.HIGH,
        confidence=0.85,
        summary=(
            f"GPU {', '.join(map(str, idle))} of {len(windows)} never did any work while the others were busy "
            f"({working_then} while computing)."
        ),
        evidence={
            "idle_gpus": idle,
            "busy_gpus": busy,
            "mean_util_pct": {str(w.gpu): round(100 * (w.mean_util or 0.0), 1) for w in windows},
            "active_util_pct": {
                str(w.gpu): round(100 * w.active_util, 1) for w in windows if w.active_util is not None
            },
        },
        est_speedup=1 / (1 - share),
        speedup_basis="the job could spread over every GPU it holds: GPUs / busy GPUs",
        fix=advise(ctx.framework, use(RemedyId.USE_EVERY_GPU, idle=[str(i) for i in idle])),
    )
