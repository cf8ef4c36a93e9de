"""Eager attention: found from the model's config, the SDPA calls seen or a trace's kernels; worth what the
fused kernel saves, timed in the job where it can be, else attention's FLOPs share."""

from __future__ import annotations

import statistics

from pitstop.core.findings import Finding, use
from pitstop.core.vocabulary import CauseId, Device, Evidence, RemedyId, Severity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.diagnose.timed import estimate_band, how_timed, noisy, spread_evidence
from pitstop.plan.flops import flops_per_token
from pitstop.remedies import advise

# the attention's timing after the window did not settle (or ran beside other work): the cause is as sure, how
# much it costs is not, so the finding is held at this confidence and graded on the range's lower end
NOISY_CONFIDENCE = 0.7

EAGER_SLOWDOWN = {"gpu": 3.0, "cpu": 2.0}
"""Where the job's attention was not timed after its window (``attention_timing``: traces, a probe inside the
user's script), how much slower per FLOP eager attention is taken to run than fused kernels: it writes and re-reads the S×S score
matrix (softmax, mask, dropout are memory-bound). On GPUs FlashAttention (Dao et al. 2022) reports 2–4× on
the attention itself; we take 3×. On CPUs the fused kernel gains less: pitstop's own measurement of a small
Llama (d=64, 256-token rows) gave 2.2×; we take 2×. The basis string always says which was used. Timed,
in the job, the same CPU gave 1.0× at 128-token rows and 1.6× at 384 (the calibration's eager cases)."""


@cause(
    CauseId.SLOW_ATTENTION,
    title="Eager (unfused) attention",
    because="attention runs the eager (unfused) path instead of FlashAttention / SDPA",
    needs_gpu=False,
    needs=((Evidence.TRACE_KERNELS, Evidence.SETTINGS),),
    fires_when="the config says `eager` (or no SDPA call was seen)",
    estimate=(
        "under `doctor` and `tune`: one layer's eager and fused (SDPA) attention timed in the job after "
        "its window, on its device at its shapes, forward and backward, in interleaved pairs until their "
        "ratio is stable; the difference × layers × micro-batches over the step time, graded at the lower end "
        "of the pairs' range (a noisy timing: confidence {NOISY_CONFIDENCE}). Elsewhere (traces, a probe inside your script): attention's "
        "FLOPs share at the row length, eager taken as {EAGER_SLOWDOWN[gpu]:.0f}× (GPU) / "
        "{EAGER_SLOWDOWN[cpu]:.0f}× (CPU) slower per FLOP"
    ),
    remedies=(RemedyId.ATTENTION,),
)
def slow_attention(ctx: RuleContext) -> Finding | None:
    att = ctx.env.attention
    impl = att.implementation
    traced = [t.attention_path for t in ctx.traces if t.attention_path]
    if impl == "eager":
        confidence = 0.95 if ctx.measured else 0.8
        how = "the model's config asks for attn_implementation='eager'"
    elif impl is not None and impl.startswith("eager (nn.MultiheadAttention"):
        confidence = 0.9 if ctx.measured else 0.7
        how = (
            "torch's nn.MultiheadAttention is called with need_weights=True (no SDPA call in the measured "
            "steps), so it computes the attention weights instead of the fused kernel"
        )
    elif traced and traced[0] in ("eager", "math"):
        confidence = 0.8
        how = (
            "the trace shows softmax between batched matmuls (the unfused path)"
            if traced[0] == "eager"
            else "the trace shows SDPA falling back to its math kernel"
        )
        impl = traced[0]
    elif impl is None and att.sdpa_calls == 0 and ctx.env.model.n_heads and not traced:
        confidence = 0.5
        how = "no fused attention (SDPA) call was seen in the measured steps"
    else:
        return None
    m = ctx.metrics
    seq = m.seq_len or (float(ctx.env.max_seq_len) if ctx.env.max_seq_len else None)
    model = ctx.env.model
    fpt = flops_per_token(model, seq)
    evidence: dict[str, object] = {
        "attn_implementation": impl,
        "sdpa_calls_per_step": None
        if att.sdpa_calls is None or not m.steps_measured
        else round(att.sdpa_calls / m.steps_measured, 1),
        "row_len": round(seq, 1) if seq else None,
    }
    est: float | None = None
    basis = "attention share of FLOPs unknown (no model config)"
    timed = _timed_attention(ctx)
    noisy_clause = ""
    share = fpt.attention / fpt.total if fpt is not None and fpt.total > 0 and seq else 0.0
    if share > 0:
        evidence["attention_flops_frac"] = round(share, 3)
    severity = Severity.MEDIUM
    if timed is not None:
        est, est_low, basis, measured, noisy_clause = timed
        evidence.update(measured)
        if noisy_clause:
            confidence = min(confidence, NOISY_CONFIDENCE)
        # timed where the job runs: graded by the share of the step it saves, as a loader's wait is, at the
        # range's lower end (a noisy timing may not raise the severity above what that end gives)
        severity = severity_for(1 - 1 / est_low, 0.20, 0.10)
    else:
        if share > 0 and seq:
            est, basis = _flops_estimate(ctx, share, seq)
        if seq is not None:
            severity = severity_for(seq, 1024, 256)
        if est is not None and est >= 1.25:
            severity = Severity.HIGH
    summary = f"Attention runs the eager (unfused) path: {how}."
    if seq:
        summary += f" Rows are {seq:.0f} tokens long, so each layer writes a {int(seq)}×{int(seq)} score matrix per head."
    if noisy_clause:
        summary += f" Its cost was {noisy_clause}."
    return Finding(
        cause=CauseId.SLOW_ATTENTION,
        severity=severity,
        confidence=confidence,
        summary=summary,
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=advise(ctx.framework, use(RemedyId.ATTENTION, **attention_target(ctx))),
    )


def _flops_estimate(ctx: RuleContext, share: float, seq: float) -> tuple[float, str]:
    """Where attention was not timed: its FLOPs ``share`` made ``EAGER_SLOWDOWN`` × slower, over compute."""
    c = ctx.compute_frac
    k = EAGER_SLOWDOWN["gpu" if ctx.gpu_possible and ctx.env.device != Device.CPU else "cpu"]
    # compute time with eager attention ∝ (1 − a) + k·a; with fused kernels ∝ 1
    basis = (
        f"attention is {share:.1%} of the FLOPs at row length {seq:.0f} (12·L·d·T of "
        f"6N + 12·L·d·T); eager attention taken as {k:.0f}× slower per FLOP than fused kernels on a "
        f"{'CPU' if ctx.env.device == Device.CPU else 'GPU'}; compute is {c:.0%} of the step"
    )
    return amdahl(c, (1 - share) + k * share), basis


def _timed_attention(ctx: RuleContext) -> tuple[float, float, str, dict[str, object], str] | None:
    """The estimate from eager and fused attention timed in the job after its window (``attention_timing``):
    what one layer's forward and backward would save, times the layers and the micro-batches of a step,
    over the mean step time; the range's lower end (from the timed pairs' quartiles); the basis; the
    evidence; and the clause that says the timing was noisy ("" where it was stable)."""
    rank = next((r for r in ctx.profile.ranks if r.attention_timing is not None and r.steps), None)
    layers = ctx.env.model.n_layers
    if rank is None or not layers:
        return None
    t = rank.attention_timing
    assert t is not None
    if t.fused_s <= 0:
        return None
    micro = statistics.fmean(max(s.micro_batches, 1) for s in rank.steps)
    step_s = rank.wall_s / len(rank.steps)

    def estimate(ratio: float) -> float:
        """The step's speed-up if eager took ``ratio`` × the fused time."""
        saved = max(0.0, ratio - 1.0) * t.fused_s * layers * micro
        return amdahl(min(saved / max(step_s, 1e-9), 0.95), float("inf"))

    saved_s = max(0.0, t.eager_s - t.fused_s) * layers * micro
    share = min(saved_s / max(step_s, 1e-9), 0.95)
    est = amdahl(share, float("inf"))
    low, high = estimate_band(t.eager_s / t.fused_s, t.spread, estimate)
    where = "GPU" if ctx.env.device == Device.CUDA else "CPU"
    said = how_timed(t.spread, low, high)
    basis = (
        f"one layer's attention timed on this {where} after the window at the job's shapes ({t.rows} rows × "
        f"{t.heads} heads × {t.seq} tokens × {t.head_dim}, {t.dtype}, forward and backward): eager "
        f"{t.eager_s * 1000:.2f} ms, fused SDPA {t.fused_s * 1000:.2f} ms; × {layers} layers"
        + (f" × {micro:.0f} micro-batches" if micro > 1 else "")
        + f" = {saved_s * 1000:.1f} ms of the {step_s * 1000:.0f} ms step"
        + ("" if t.eager_s > t.fused_s else " (the fused kernel was not faster here)")
        + (f"; {said}" if said else "")
        + ("; the severity follows the range's lower end" if noisy(t.spread) else "")
    )
    measured: dict[str, object] = {
        "eager_ms_per_layer": round(t.eager_s * 1000, 3),
        "fused_ms_per_layer": round(t.fused_s * 1000, 3),
        "attention_saved_frac": round(share, 3),
        "eager_over_fused": round(t.eager_s / t.fused_s, 3),
        **spread_evidence(t.spread, low, high, "eager_over_fused"),
    }
    return est, low, basis, measured, said if noisy(t.spread) else ""


def attention_target(ctx: RuleContext) -> dict[str, object]:
    """What the attention advice loads: FlashAttention 2 on a GPU (SDPA as the no-install alternative), SDPA
    elsewhere; and whether the model is a transformers model (then the fix is a loading argument)."""
    on_gpu = ctx.env.device not in (None, Device.CPU)
    model = ctx.env.model
    hf_model = True if model.library == "transformers" or model.model_type else None
    mha = bool(
        ctx.env.attention.implementation and "nn.MultiheadAttention" in ctx.env.attention.implementation
    )
    if on_gpu and not mha:
        return {"target": "flash_attention_2", "alternative": "sdpa", "hf_model": hf_model}
    return {"target": "sdpa", "hf_model": hf_model, "mha": mha}
