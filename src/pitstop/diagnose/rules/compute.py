"""Rules about how the step computes: attention path, precision, batch size, host syncs, MFU."""

from __future__ import annotations

from pitstop.diagnose import fixes
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.findings import Finding
from pitstop.hardware import EXPECTED_MFU
from pitstop.plan.flops import flops_per_token

EAGER_SLOWDOWN = {"gpu": 3.0, "cpu": 2.0}
"""How much slower per FLOP eager attention runs than fused kernels: it writes and re-reads the S×S score
matrix (softmax, mask, dropout are memory-bound). On GPUs FlashAttention (Dao et al. 2022) reports 2–4× on
the attention itself; we take 3×. On CPUs the fused kernel gains less: pitstop's own measurement of a small
Llama (d=64, 256-token rows) gave 2.2×; we take 2×. The basis string always says which was used."""


def slow_attention(ctx: RuleContext) -> Finding | None:
    att = ctx.env.attention
    impl = att.implementation
    if impl == "eager":
        confidence = 0.95
        how = "the model's config asks for attn_implementation='eager'"
    elif impl is None and att.sdpa_calls == 0 and ctx.env.model.n_heads:
        confidence = 0.5
        how = "no fused attention (SDPA) call was seen in the measured steps"
    else:
        return None
    m = ctx.metrics
    seq = m.seq_len
    model = ctx.env.model
    fpt = flops_per_token(model, seq)
    evidence: dict[str, object] = {
        "attn_implementation": impl,
        "sdpa_calls_per_step": None
        if att.sdpa_calls is None or not m.steps_measured
        else round(att.sdpa_calls / m.steps_measured, 1),
        "row_len": round(seq, 1) if seq else None,
    }
    est = None
    basis = "attention share of FLOPs unknown (no model config)"
    share = None
    if fpt is not None and fpt.total > 0 and fpt.attention > 0:
        share = fpt.attention / fpt.total
        c = ctx.compute_frac
        # compute time with eager attention ∝ (1 − a) + k·a; with fused kernels ∝ 1
        k = EAGER_SLOWDOWN["gpu" if ctx.on_gpu else "cpu"]
        old = (1 - share) + k * share
        est = amdahl(c, old)
        evidence["attention_flops_frac"] = round(share, 3)
        basis = (
            f"attention is {share:.1%} of the FLOPs at row length {seq:.0f} (12·L·d·T of "
            f"6N + 12·L·d·T); eager attention taken as {k:.0f}× slower per FLOP than fused kernels on a "
            f"{'GPU' if ctx.on_gpu else 'CPU'}; compute is {c:.0%} of the step"
        )
    severity = "medium"
    if seq is not None:
        severity = severity_for(seq, 1024, 256)
    if est is not None and est >= 1.25:
        severity = "high"
    summary = f"Attention runs the eager (unfused) path: {how}."
    if seq:
        summary += f" Rows are {seq:.0f} tokens long, so each layer writes a {int(seq)}×{int(seq)} score matrix per head."
    return Finding(
        cause="slow_attention",
        severity=severity,  # type: ignore[arg-type]
        confidence=confidence,
        summary=summary,
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=fixes.attention(ctx.framework, ctx.on_gpu),
    )


def no_mixed_precision(ctx: RuleContext) -> Finding | None:
    if not ctx.on_gpu:
        return None
    dtype = ctx.metrics.compute_dtype
    gpu = ctx.gpu
    if dtype not in ("fp32", "tf32"):
        return None
    if gpu is not None and not gpu.has_fast_low_precision:
        return None
    bf16_ok = gpu is None or gpu.peak_flops("bf16") is not None
    low = "bf16" if bf16_ok else "fp16"
    evidence: dict[str, object] = {
        "param_dtype": ctx.env.param_dtype,
        "autocast_dtype": ctx.env.autocast_dtype,
        "tf32": ctx.env.tf32,
        "gpu": gpu.key if gpu else ctx.env.gpu_name,
    }
    # realistic factors, below the peak ratios because not all step time is matmul
    factor = 2.0 if dtype == "tf32" else 3.0
    if gpu is not None:
        now_peak = gpu.peak_flops(dtype) or gpu.peak_flops("fp32")
        low_peak = gpu.peak_flops(low)
        if now_peak and low_peak:
            evidence["peak_ratio"] = round(low_peak / now_peak, 1)
            factor = min(factor, low_peak / now_peak)
    c = ctx.compute_frac
    return Finding(
        cause="no_mixed_precision",
        severity="high" if dtype == "fp32" else "medium",
        confidence=0.85,
        summary=(
            f"Matrix math runs in {dtype.upper()} "
            + (
                "without TF32 or bf16/fp16 autocast"
                if dtype == "fp32"
                else "(TF32) without bf16/fp16 autocast"
            )
            + f" on a GPU whose {low} tensor cores are much faster."
        ),
        evidence=evidence,
        est_speedup=amdahl(c, factor),
        speedup_basis=(
            f"compute is {c:.0%} of the step; {low} taken as {factor:.1f}× faster for it "
            "(capped below the datasheet peak ratio because not all compute is matmul)"
        ),
        fix=fixes.precision(ctx.framework, bf16_ok, dtype == "tf32"),
    )


def small_batch(ctx: RuleContext) -> Finding | None:
    if not ctx.on_gpu:
        return None
    m = ctx.metrics
    util = m.gpu_util
    if util is None or util >= 0.75:
        return None
    if (m.data_wait_frac or 0.0) >= 0.15:
        return None  # the idle time is the input pipeline's; dataloader_bound explains it
    mem = m.gpu_mem_used_frac
    if mem is not None and mem > 0.85:
        return None  # no room for a bigger batch
    est = min(1.0 / max(util, 0.05), 4.0)
    return Finding(
        cause="small_batch",
        severity=severity_for(1 - util, 0.6, 0.35),  # type: ignore[arg-type]
        confidence=0.7 if mem is not None else 0.5,
        summary=(
            f"The GPU is busy only {util:.0%} of the time with {m.tokens_per_micro_batch or 0:.0f} tokens per "
            "micro-batch"
            + (f" and {1 - mem:.0%} of its memory free" if mem is not None else "")
            + ": the batch is too small to fill it."
        ),
        evidence={
            "gpu_util": round(util, 3),
            "gpu_mem_used_frac": None if mem is None else round(mem, 3),
            "micro_batch_size": ctx.env.micro_batch_size,
            "grad_accum_steps": ctx.env.grad_accum_steps,
            "tokens_per_micro_batch": None
            if m.tokens_per_micro_batch is None
            else round(m.tokens_per_micro_batch),
        },
        est_speedup=est,
        speedup_basis="NVML utilization (measured); filling the idle share gives at most 1/util (capped at 4×)",
        fix=fixes.bigger_batch(ctx.framework, ctx.env.micro_batch_size, ctx.env.grad_accum_steps),
    )


def host_sync(ctx: RuleContext) -> Finding | None:
    if not ctx.on_gpu:
        return None
    m = ctx.metrics
    per_step = m.syncs_per_step
    if per_step is None or per_step < 1:
        return None
    util = m.gpu_util
    idle = None if util is None else 1 - util
    if idle is not None and idle < 0.05:
        return None
    est = None if idle is None else amdahl(min(idle, m.sync_frac or idle), float("inf"))
    return Finding(
        cause="host_sync",
        severity="medium" if per_step >= 2 and (idle or 0) >= 0.15 else "low",
        confidence=0.6,
        summary=(
            f"The host waits for the GPU {per_step:.1f} times per step (.item(), .cpu(), synchronize), "
            "so the launch queue drains and the GPU idles while the next kernels are issued."
        ),
        evidence={
            "syncs_per_step": round(per_step, 2),
            "sync_frac": None if m.sync_frac is None else round(m.sync_frac, 3),
            "gpu_util": None if util is None else round(util, 3),
        },
        est_speedup=est,
        speedup_basis="bounded by the GPU's idle share (1 − NVML utilization) and the measured blocked time",
        fix=fixes.host_sync(ctx.framework),
    )


def low_mfu_unexplained(ctx: RuleContext) -> Finding | None:
    if not ctx.on_gpu:
        return None
    m = ctx.metrics
    if m.mfu is None or m.gpu_util is None or m.gpu_util < 0.85:
        return None
    floor = EXPECTED_MFU[0] * 0.6
    if m.mfu >= floor:
        return None
    if any(f.severity == "high" for f in ctx.earlier):
        return None  # a named cause already explains the gap
    return Finding(
        cause="low_mfu_unexplained",
        severity="medium",
        confidence=0.5,
        summary=(
            f"The GPU is {m.gpu_util:.0%} busy but reaches only {m.mfu:.1%} MFU; well-tuned fine-tunes reach "
            f"{EXPECTED_MFU[0]:.0%}–{EXPECTED_MFU[1]:.0%} on this GPU."
        ),
        evidence={
            "mfu": round(m.mfu, 4),
            "gpu_util": round(m.gpu_util, 3),
            "gpu": m.gpu,
            "compute_dtype": m.compute_dtype,
        },
        est_speedup=min(EXPECTED_MFU[0] / max(m.mfu, 1e-6), 4.0),
        speedup_basis=f"reaching the low end of the expected MFU range ({EXPECTED_MFU[0]:.0%}); capped at 4×",
        fix=fixes.low_mfu(ctx.framework),
    )
