"""Low MFU that no named cause explains: runs after every other rule and stays quiet when one of them
already explains the gap (a HIGH finding) or an idle GPU does."""

from __future__ import annotations

from pitstop.core.findings import Finding, use
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, Severity
from pitstop.diagnose.activity import read_activity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext
from pitstop.hardware import EXPECTED_MFU
from pitstop.remedies import advise


@cause(
    CauseId.LOW_MFU_UNEXPLAINED,
    title="Busy GPU, low FLOPs utilization",
    because="utilization is high but model-FLOPs utilization stays far below what the GPU can do",
    needs_gpu=True,
    needs=(Evidence.STEPS, Evidence.MODEL_SIZE),
    fires_when="GPU ≥ 85% busy, MFU < 60% of the low end of 40–50%, no high finding",
    estimate="to the low end of the range",
    remedies=(RemedyId.FUSED_KERNELS,),
    reads_findings=True,
)
def low_mfu_unexplained(ctx: RuleContext) -> Finding | None:
    if not ctx.on_gpu:
        return None
    m = ctx.metrics
    if m.mfu is None:
        return None
    floor = EXPECTED_MFU[0] * 0.6
    if m.mfu >= floor:
        return None
    if any(f.severity == Severity.HIGH for f in ctx.earlier):
        return None  # a named cause already explains the gap
    if m.gpu_util is not None and m.gpu_util < 0.85:
        return None  # an idle GPU is explained by the idle-time rules
    busy = "" if m.gpu_util is None else f"The GPU is {m.gpu_util:.0%} busy but "
    act = read_activity(ctx.profile)
    bound = act if act is not None and act.memory_bound else None
    evidence: dict[str, object] = {
        "mfu": round(m.mfu, 4),
        "gpu_util": None if m.gpu_util is None else round(m.gpu_util, 3),
        "gpu": m.gpu,
        "compute_dtype": m.compute_dtype,
    }
    if act is not None:
        evidence.update(act.evidence(), memory_bound=bound is not None)
    confidence = 0.5 if m.gpu_util is not None else 0.35
    return Finding(
        cause=CauseId.LOW_MFU_UNEXPLAINED,
        severity=Severity.MEDIUM,
        confidence=confidence + (0.15 if bound is not None else 0.0),
        summary=(
            f"{busy}{'reaches' if busy else 'The run reaches'} only {m.mfu:.1%} MFU; well-tuned fine-tunes reach "
            f"{EXPECTED_MFU[0]:.0%}–{EXPECTED_MFU[1]:.0%} on this GPU."
            + (
                f" The counters say the step is memory-bound ({bound.words()}): unfused elementwise work, not "
                "matrix math, sets its pace."
                if bound is not None
                else ""
            )
            + (
                ""
                if m.gpu_util is not None
                else " Without per-step data the cause is not known: run `pitstop doctor` or record a trace."
            )
        ),
        evidence=evidence,
        est_speedup=min(EXPECTED_MFU[0] / max(m.mfu, 1e-6), 4.0),
        speedup_basis=f"reaching the low end of the expected MFU range ({EXPECTED_MFU[0]:.0%}); capped at 4×",
        fix=advise(ctx.framework, use(RemedyId.FUSED_KERNELS)),
    )
