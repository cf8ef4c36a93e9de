"""A GPU the job holds but leaves idle: visible GPUs that did no work while others computed."""

from __future__ import annotations

from pitstop.core.findings import Finding, use
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, Severity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext
from pitstop.hardware import lookup_gpu
from pitstop.remedies import advise

PEAK_DTYPES = (
    "bf16",
    "fp16",
    "tf32",
    "fp32",
)  # the first dtype every card of the job has a peak for weighs them


def _names(ctx: RuleContext, gpus: list[int]) -> dict[int, str | None]:
    """Each GPU's model name, as its rank's environment (the log's name column) says."""
    by_rank = {r.rank: r.environment.gpu_name for r in ctx.profile.ranks}
    return {g: by_rank.get(g) or ctx.env.gpu_name for g in gpus}


def _speedup(names: dict[int, str | None], idle: list[int]) -> tuple[float | None, str]:
    """What putting the idle GPUs to work could give, and its basis: the GPUs' summed peak over the busy
    ones' when their models differ (an RTX 4080 beside an RTX 4090 adds less than a second 4090), the count
    when they are alike or unnamed, unknown when a card is not in the hardware table."""
    models = {n for n in names.values()}
    busy = [g for g in names if g not in idle]
    if len(models) <= 1:
        alike = "alike GPUs" if None not in models else "GPUs assumed alike (the log names no model)"
        return len(names) / len(
            busy
        ), f"the job could spread over every GPU it holds: GPUs / busy GPUs ({alike})"
    specs = {g: lookup_gpu(n) for g, n in names.items()}
    unknown = sorted({str(names[g] or f"GPU {g}") for g, s in specs.items() if s is None})
    if unknown:
        return None, (
            f"unknown: the GPUs differ and {', '.join(unknown)} is not in pitstop's GPU table, so how much "
            "work it could take is not known (`pitstop gpus` lists the models)"
        )
    for dtype in PEAK_DTYPES:
        peaks = {g: s.peak_tflops.get(dtype) for g, s in specs.items() if s is not None}
        if all(p for p in peaks.values()):
            total = sum(p or 0.0 for p in peaks.values())
            working = sum(peaks[g] or 0.0 for g in busy)
            each = ", ".join(f"GPU {g} {peaks[g]:g}" for g in sorted(peaks))
            return total / working, (
                f"the job spread over every GPU in proportion to its speed: summed {dtype} dense peak of all "
                f"GPUs over the busy ones' ({each} TFLOP/s)"
            )
    return None, "unknown: the GPUs differ and share no precision with a known peak"


@cause(
    CauseId.IDLE_GPU,
    title="A GPU of the job does nothing",
    because=("multi-GPU: one of the job's GPUs never does any work (a launcher or device-placement mistake)"),
    needs_gpu=True,
    needs=(Evidence.GPU_UTILIZATION,),
    fires_when="a GPU of the samples never works (peak ≤ 2%) while another computes ≥ 20% busy",
    estimate=(
        "GPUs / busy GPUs when the GPUs are alike; summed peak / busy GPUs' peak when their models differ "
        "(unknown when one is not in the hardware table)"
    ),
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
    names = _names(ctx, [w.gpu for w in windows])
    speedup, basis = _speedup(names, idle)

    def called(g: int) -> str:
        return f"GPU {g} ({names[g]})" if names[g] and len(set(names.values())) > 1 else f"GPU {g}"

    working_then = ", ".join(f"{called(w.gpu)} {w.active_util or 0.0:.0%}" for w in windows if w.gpu in busy)
    return Finding(
        cause=CauseId.IDLE_GPU,
        severity=Severity.HIGH,
        confidence=0.85,
        summary=(
            f"{', '.join(called(g) for g in idle)} of {len(windows)} is unused: it never did any work while "
            f"the others were busy ({working_then} while computing)."
        ),
        evidence={
            "idle_gpus": idle,
            "busy_gpus": busy,
            "gpu_names": {str(g): n for g, n in names.items() if n},
            "mean_util_pct": {str(w.gpu): round(100 * (w.mean_util or 0.0), 1) for w in windows},
            "active_util_pct": {
                str(w.gpu): round(100 * w.active_util, 1) for w in windows if w.active_util is not None
            },
        },
        est_speedup=speedup,
        speedup_basis=basis,
        fix=advise(ctx.framework, use(RemedyId.USE_EVERY_GPU, idle=[str(i) for i in idle])),
    )
