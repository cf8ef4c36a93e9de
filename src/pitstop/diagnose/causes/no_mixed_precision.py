"""fp32 matrix math on a GPU with tensor cores: found from the dtypes the job computes in (autocast, the
parameters, a trace's kernels) and the tensor pipes' activity; worth the compute share at the faster peak."""

from __future__ import annotations

from pitstop.core.findings import Finding, Use, use
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, Severity
from pitstop.diagnose.activity import Activity, read_activity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl
from pitstop.remedies import advise


@cause(
    CauseId.NO_MIXED_PRECISION,
    title="Full fp32 matrix math",
    because="matrix math runs in full fp32 without bf16/fp16 or TF32 on a GPU that has tensor cores",
    needs_gpu=True,
    needs=((Evidence.TRACE_KERNELS, Evidence.SETTINGS),),
    fires_when="matmuls in fp32 or TF32 on a tensor-core GPU",
    estimate="compute share × min(peak ratio, 3× fp32 / 2× TF32)",
    remedies=(RemedyId.BF16, RemedyId.FP16, RemedyId.TF32),
)
def no_mixed_precision(ctx: RuleContext) -> Finding | None:
    if not ctx.gpu_possible:
        return None
    gpu = ctx.gpu
    if gpu is not None and not gpu.has_fast_low_precision:
        return None
    dtype = ctx.metrics.compute_dtype
    fp32_gemm = ctx.trace_mean(lambda t: t.fp32_gemm_frac)
    traced = fp32_gemm is not None and fp32_gemm >= 0.5 and ctx.on_gpu
    act = read_activity(ctx.profile)
    counted = act is not None and act.tensor_idle and ctx.on_gpu  # tensor pipes idle while the SMs work
    if not traced and dtype not in ("fp32", "tf32") and not (counted and dtype is None):
        return None
    if not ctx.on_gpu and ctx.env.device is not None:
        return None
    if traced or dtype is None:
        dtype = "fp32"  # fp32 GEMMs in the trace; or idle tensor pipes, which TF32 would use too
    bf16_ok = gpu is None or gpu.peak_flops("bf16") is not None
    low = "bf16" if bf16_ok else "fp16"
    evidence: dict[str, object] = {
        "param_dtype": ctx.env.param_dtype,
        "autocast_dtype": ctx.env.autocast_dtype,
        "tf32": ctx.env.tf32,
        "gpu": gpu.key if gpu else ctx.env.gpu_name,
    }
    if fp32_gemm is not None:
        evidence["fp32_gemm_time_frac"] = round(fp32_gemm, 3)
    factor = 2.0 if dtype == "tf32" else 3.0
    if gpu is not None:
        now_peak = gpu.peak_flops(dtype or "fp32") or gpu.peak_flops("fp32")
        low_peak = gpu.peak_flops(low)
        if now_peak and low_peak:
            evidence["peak_ratio"] = round(low_peak / now_peak, 1)
            factor = min(factor, low_peak / now_peak)
    c = ctx.compute_frac
    measured = ctx.measured
    if act is not None and "tensor_active" in act.means:
        evidence.update(act.evidence())
    how = (
        "GEMM kernels in the trace run in plain fp32"
        if traced
        else f"the tensor pipes are idle while the SMs work ({act.words()})"
        if counted and act is not None and ctx.metrics.compute_dtype is None
        else (
            f"matrix math runs in {str(dtype).upper()}"
            + (
                " without TF32 or bf16/fp16 autocast"
                if dtype == "fp32"
                else " (TF32) without bf16/fp16 autocast"
            )
        )
    )
    return Finding(
        cause=CauseId.NO_MIXED_PRECISION,
        severity=Severity.HIGH if dtype == "fp32" else Severity.MEDIUM,
        confidence=_precision_confidence(measured, counted, act),
        summary=f"{how[0].upper() + how[1:]} on a GPU whose {low} tensor cores are much faster."
        + _tensor_words(act, counted),
        evidence=evidence,
        est_speedup=amdahl(c, factor) if measured else None,
        speedup_basis=(
            f"compute is {c:.0%} of the step; {low} taken as {factor:.1f}× faster for it "
            "(capped below the datasheet peak ratio because not all compute is matmul)"
        )
        if measured
        else "config only: no step time measured",
        fix=advise(ctx.framework, *precision_uses(bf16_ok, dtype == "tf32", inference=ctx.inference)),
    )


def _precision_confidence(measured: bool, counted: bool, act: Activity | None) -> float:
    """How sure: per-step data or a trace say 0.85, configs 0.6; the tensor counter read idle raises it
    (the matrix math is off the tensor cores, measured), read busy lowers it (the counters disagree)."""
    base = 0.85 if measured else 0.6
    if counted:
        return 0.95 if measured else 0.8
    if act is not None and act.tensor_busy:
        return min(base, 0.4)
    return base


def _tensor_words(act: Activity | None, counted: bool) -> str:
    if act is None or "tensor_active" not in act.means:
        return ""
    if counted:
        return f" The tensor-pipe counter confirms it: {act.get('tensor_active'):.1%} busy."
    if act.tensor_busy:
        return (
            f" But the tensor pipes read {act.get('tensor_active'):.0%} busy: some matrix math does use them."
        )
    return ""


def precision_uses(bf16_ok: bool, tf32_only: bool, inference: bool = False) -> list[Use]:
    """Mixed precision in the low type the GPU has tensor cores for; TF32 for what stays fp32. An inference
    trace is told to cast the model to bf16 (no master weights to keep)."""
    low = (
        use(RemedyId.BF16, inference=True)
        if bf16_ok and inference
        else use(RemedyId.BF16)
        if bf16_ok
        else use(RemedyId.FP16)
    )
    return [low] if tf32_only or not bf16_ok else [low, use(RemedyId.TF32)]
