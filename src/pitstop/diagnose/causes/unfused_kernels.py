"""unfused_kernels: work that fused kernels do in one pass runs as many small ones here.

Three parts, each with its own evidence and estimate; the finding names those that apply.

* **Loss on full logits** (vocabulary ≥ 32k, no fused linear-cross-entropy): the planner's bytes model gives
  the logits the loss materialises per micro-batch (12 bytes per token per vocabulary entry unfused, 2 fused);
  their traffic at the GPU's memory bandwidth, over the measured step, is the share a fused loss removes —
  an estimate from bytes, not a measurement.
* **Optimizer without fused / foreach on CUDA**: the measured optimizer share, made faster by an assumed
  factor (for-loop → fused ×4, foreach → fused ×1.5; stated as assumptions).
* **RMSNorm / RoPE / SwiGLU as separate kernels** where Liger Kernel is installed but not applied: named,
  not estimated.

The GPUs' activity counters (DCGM, GPM) add a verdict: DRAM busy while the tensor pipes are not is a
memory-bound step, what unfused elementwise work looks like. It raises the confidence of a finding made from
the parts above, and on its own (an offline run whose kernels pitstop never saw) names the cause with low
confidence and no estimate."""

from __future__ import annotations

from dataclasses import replace

from pitstop.core.findings import Finding, Use, use
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, Severity
from pitstop.diagnose.activity import Activity, read_activity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.plan.from_run import setup_for_run
from pitstop.plan.memory import logits
from pitstop.remedies import advise

GIB = 1024**3
LARGE_VOCAB = 32_000
FUSABLE_OPTIMIZERS = ("Adam", "AdamW", "SGD", "Adagrad")
LOOP_TO_FUSED = 4.0  # assumed speed-up of the optimizer step, for-loop → fused
FOREACH_TO_FUSED = 1.5  # assumed, foreach → fused
TRAFFIC_PASSES = 2.0  # the unfused loss writes its logits once and reads them back at least once
BW_EFFICIENCY = 0.8
LIGER_MODELS = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3",
    "phi3",
    "granite",
    "olmo2",
)
MIN_PART = 1.03  # a part below this estimated speed-up is not named


def _logits_part(ctx: RuleContext) -> tuple[float, dict[str, object]] | None:
    """(estimated speed-up, evidence) of a fused linear-cross-entropy, from the bytes model."""
    env, m, gpu = ctx.env, ctx.metrics, ctx.gpu
    vocab = env.model.vocab_size or 0
    if vocab < LARGE_VOCAB or gpu is None or not m.step_time_s:
        return None
    seq = round(m.seq_len or env.max_seq_len or 0)
    setup = setup_for_run(env, seq=seq)
    if setup is None or not seq:
        return None
    full = logits(setup)
    fused = logits(replace(setup, chunked_loss=True))
    micro_batches = env.grad_accum_steps or 1
    seconds = TRAFFIC_PASSES * (full - fused) * micro_batches / (gpu.mem_bw_tbs * 1e12 * BW_EFFICIENCY)
    share = min(0.9, seconds / m.step_time_s)
    evidence: dict[str, object] = {
        "vocab_size": vocab,
        "logits_gib_per_micro_batch": round(full / GIB, 2),
        "fused_loss_gib_per_micro_batch": round(fused / GIB, 2),
        "estimated_loss_traffic_frac": round(share, 3),
    }
    return amdahl(share, float("inf")), evidence


def _optimizer_part(ctx: RuleContext) -> tuple[float, dict[str, object]] | None:
    k = ctx.env.kernels
    if k is None or not ctx.on_gpu or k.optimizer not in FUSABLE_OPTIMIZERS or k.optimizer_fused:
        return None
    share = ctx.metrics.optimizer_frac
    factor = FOREACH_TO_FUSED if k.optimizer_foreach else LOOP_TO_FUSED
    evidence: dict[str, object] = {
        "optimizer": k.optimizer,
        "optimizer_impl": "foreach"
        if k.optimizer_foreach
        else "for-loop"
        if k.optimizer_foreach is False
        else None,
        "optimizer_frac": None if share is None else round(share, 3),
    }
    if share is None:
        return None
    return amdahl(share, factor), evidence


def _memory_bound_only(ctx: RuleContext, act: Activity) -> Finding:
    """The counters' memory-bound verdict where nothing else about the run's kernels is known."""
    model_type = ctx.env.model.model_type or None
    return Finding(
        cause=CauseId.UNFUSED_KERNELS,
        severity=Severity.MEDIUM,
        confidence=0.45,
        summary=(
            f"The step is memory-bound ({act.words()}): DRAM is busy while the tensor pipes are not, the "
            "pattern of unfused elementwise, normalisation and loss kernels. Which ones is not known offline: "
            "run `pitstop doctor` or record a trace."
        ),
        evidence={**act.evidence(), "memory_bound": True, "model_type": model_type},
        est_speedup=None,
        speedup_basis="not estimated: the counters say the step is memory-bound, not which kernels make it so",
        fix=advise(
            ctx.framework,
            use(RemedyId.LIGER_KERNELS, installed=False, model_type=model_type),
            use(RemedyId.COMPILE_MODEL),
        ),
    )


@cause(
    CauseId.UNFUSED_KERNELS,
    title="Unfused loss, optimizer or norms",
    because=(
        "the loss materialises full large-vocabulary logits, the optimizer steps parameter by parameter, "
        "or norms and activations run as separate kernels where fused ones are available"
    ),
    needs_gpu=True,
    needs=(Evidence.PROCESS,),
    fires_when=(
        "vocabulary ≥ {LARGE_VOCAB:,} without a fused linear-cross-entropy; Adam/AdamW/SGD without `fused` "
        "on CUDA; Liger installed but not applied"
    ),
    estimate=(
        "loss: the planner's logits bytes ×{TRAFFIC_PASSES:.0f} at {BW_EFFICIENCY:.0%} of memory bandwidth "
        "over the step (estimate); optimizer: measured share × assumed ×{LOOP_TO_FUSED:.0f} (for-loop) / "
        "×{FOREACH_TO_FUSED} (foreach)"
    ),
    remedies=(RemedyId.FUSED_OPTIMIZER, RemedyId.LIGER_KERNELS, RemedyId.COMPILE_MODEL),
)
def unfused_kernels(ctx: RuleContext) -> Finding | None:
    act = read_activity(ctx.profile) if ctx.on_gpu else None
    bound = act if act is not None and act.memory_bound else None
    found = _unfused_parts(ctx, bound)
    if found is None and bound is not None and ctx.env.kernels is None:
        return _memory_bound_only(ctx, bound)
    return found


def _unfused_parts(ctx: RuleContext, bound: Activity | None) -> Finding | None:
    """The parts pitstop saw; ``bound``: the counters' memory-bound verdict, which raises the confidence."""
    k = ctx.env.kernels
    if k is None:
        return None  # nothing read about the run's kernels (an offline source)
    parts: list[str] = []
    evidence: dict[str, object] = {}
    saved = 0.0
    bases: list[str] = []
    uses: list[Use] = []
    optimizer = _optimizer_part(ctx)
    if optimizer is not None and optimizer[0] >= MIN_PART:
        est, ev = optimizer
        evidence.update(ev)
        saved += 1 - 1 / est
        parts.append(
            f"the {k.optimizer} step runs {ev['optimizer_impl'] or 'unfused'} ({ev['optimizer_frac']:.0%} of the step)"
        )
        bases.append(
            f"optimizer: measured share × assumed ×{FOREACH_TO_FUSED if k.optimizer_foreach else LOOP_TO_FUSED:g} when fused"
        )
        uses.append(use(RemedyId.FUSED_OPTIMIZER, optimizer=k.optimizer))
    loss = None if k.liger_applied else _logits_part(ctx)
    if loss is not None and loss[0] >= MIN_PART:
        est, ev = loss
        evidence.update(ev)
        saved += 1 - 1 / est
        parts.append(
            f"the loss materialises {ev['logits_gib_per_micro_batch']} GiB of logits per micro-batch "
            f"(vocabulary {ev['vocab_size']:,}; a fused linear-cross-entropy needs {ev['fused_loss_gib_per_micro_batch']} GiB)"
        )
        bases.append(
            f"loss: estimate from the planner's bytes model, logits traffic ×{TRAFFIC_PASSES:g} at "
            f"{BW_EFFICIENCY:.0%} of the GPU's memory bandwidth over the measured step"
        )
    model_type = ctx.env.model.model_type or ""
    norms = ctx.on_gpu and bool(k.liger_installed) and not k.liger_applied and model_type in LIGER_MODELS
    if norms:
        parts.append(
            f"RMSNorm, RoPE and SwiGLU run as separate kernels although Liger Kernel is installed for {model_type}"
        )
        bases.append("norms: not estimated")
    if not parts:
        return None
    evidence.update(
        liger_installed=k.liger_installed,
        liger_applied=k.liger_applied,
        compiled=k.compiled,
        model_type=model_type or None,
    )
    if (loss is not None and loss[0] >= MIN_PART) or norms:
        uses.append(
            use(RemedyId.LIGER_KERNELS, installed=bool(k.liger_installed), model_type=model_type or None)
        )
    if not k.compiled and model_type:
        uses.append(use(RemedyId.COMPILE_MODEL))
    overall = 1 / (1 - min(saved, 0.9)) if saved else None
    if bound is not None:  # the counters agree: the step waits on memory, not on the tensor cores
        evidence.update(bound.evidence(), memory_bound=True)
    return Finding(
        cause=CauseId.UNFUSED_KERNELS,
        severity=severity_for(saved, 0.20, 0.08),
        confidence=(0.6 if loss is not None else 0.75) + (0.15 if bound is not None else 0.0),
        summary="Unfused kernels: "
        + "; ".join(parts)
        + "."
        + (f" The counters agree: the step is memory-bound ({bound.words()})." if bound is not None else ""),
        evidence=evidence,
        est_speedup=overall,
        speedup_basis="; ".join(bases),
        fix=advise(ctx.framework, *uses),
    )
