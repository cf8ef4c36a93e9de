"""quantized_base: the base model's linears are quantized (bitsandbytes 4 / 8-bit, torchao), so every matmul
dequantizes its weight first — a trade of speed for memory, not a bug.

QLoRA keeps the frozen base in 4 bits to fit a model or a micro-batch that bf16 would not: each step pays a
dequantization per linear in the forward, another in the backward (the input's gradient), a third where
activation checkpointing recomputes the forward. Whether the trade is worth it is a memory question: where bf16
LoRA of the same model fits the GPU at the same micro-batch, the memory bought is not needed; where it does not,
the memory is better spent on a larger micro-batch than left idle. The planner (``plan.memory``, the model
``pitstop plan`` uses) answers both for the run's model, row length and micro-batch.

The live probe (``RankProfile.quantized_base``, ``probe/collectors/quantized.py``) counts the quantized linears
and, after doctor's or tune's window, times one layer of each weight shape on the job's device at its tokens per
micro-batch, as the job runs it and as a dense linear in the compute dtype: the difference over the layers and
micro-batches of a step is what dense weights save. A config (``quantization_config`` in config.json,
``load_in_4bit`` in a TRL / Axolotl / LLaMA-Factory config: ``Environment.quantized_base``) says only that the
base is quantized: a finding at a lower confidence, not estimated."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pitstop.core.findings import Finding, use
from pitstop.core.profile import QuantizedBase, RankProfile
from pitstop.core.vocabulary import CauseId, Device, Evidence, RemedyId, Severity, Source
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl
from pitstop.diagnose.timed import estimate_band, how_timed, noisy, spread_evidence
from pitstop.plan.from_run import has_shape, setup_for_run
from pitstop.plan.memory import GIB, memory
from pitstop.plan.params import _analytic
from pitstop.plan.planner import largest_micro_batch
from pitstop.remedies import advise

TIMED_CONFIDENCE = 0.85  # the probe found the quantized linears and timed them against dense ones in the job
NOISY_CONFIDENCE = 0.7  # as TIMED, but the timing did not settle (or ran beside other work)
UNTIMED_CONFIDENCE = 0.6  # the quantized linears found; their cost not timed (no closing window)
CONFIG_CONFIDENCE = 0.4  # a config asks for a quantized base; nothing measured it
MEDIUM_SHARE = 0.15  # the dequantization's share of the step from which the trade is worth a look (medium)
FIT_SHARE = 0.9  # a planned peak must stay under this share of the GPU's memory to count as fitting
MAX_SHARE = 0.95  # a timed share is capped here (a timing on a busy machine can exceed a short step)
LORA_RANK = 16  # the adapters' rank assumed where the run did not say how many parameters it trains
# sources whose probe watched the model itself: there, no quantized linear means none, whatever a config says
WATCHED = (Source.DOCTOR, Source.TUNE, Source.WATCH, Source.CALLBACK)


@dataclass(frozen=True)
class PlanVerdict:
    """The planner's answer for the run: a bf16 base at the same micro-batch, and the largest micro-batch the
    quantized base fits; ``why`` says why it was not evaluated."""

    why: str | None = None  # set when not evaluated
    gpu_gib: float | None = None
    bf16_gib: float | None = None  # bf16 LoRA's planned peak at the run's micro-batch
    quantized_gib: float | None = None  # the 4-bit base's planned peak at the run's micro-batch
    micro_batch: int | None = None
    micro_batch_fits: int | None = None  # the largest micro-batch the 4-bit base fits

    @property
    def bf16_fits(self) -> bool | None:
        if self.bf16_gib is None or self.gpu_gib is None:
            return None
        return self.bf16_gib <= FIT_SHARE * self.gpu_gib

    def evidence(self) -> dict[str, object]:
        if self.why is not None:
            return {"plan": f"not evaluated: {self.why}"}
        return {
            "plan_gpu_gib": round(self.gpu_gib or 0.0, 1),
            "plan_bf16_lora_gib": None if self.bf16_gib is None else round(self.bf16_gib, 2),
            "plan_quantized_gib": None if self.quantized_gib is None else round(self.quantized_gib, 2),
            "bf16_lora_fits": self.bf16_fits,
            "micro_batch": self.micro_batch,
            "micro_batch_fits_quantized": self.micro_batch_fits,
        }

    def sentence(self, bits: int) -> str:
        if self.why is not None:
            return f"Whether bf16 LoRA would fit was not evaluated: {self.why}."
        said = (
            f"The planner puts bf16 LoRA of this model at micro-batch {self.micro_batch} at {self.bf16_gib:.1f} "
            f"GiB of the GPU's {self.gpu_gib:.0f} GiB"
        )
        if self.bf16_fits:
            said += ": it fits, so the memory the quantized base saves is not needed."
        else:
            said += (
                f": it does not fit under {FIT_SHARE:.0%}, so the {bits}-bit base is what makes this run fit."
            )
        if self.quantized_gib is not None and self.micro_batch and self.micro_batch_fits:
            if self.micro_batch_fits > self.micro_batch:
                said += (
                    f" With the {bits}-bit base ({self.quantized_gib:.1f} GiB planned now) a micro-batch of up to "
                    f"{self.micro_batch_fits} fits."
                )
            else:
                said += f" With the {bits}-bit base no larger micro-batch fits ({self.quantized_gib:.1f} GiB now)."
        return said


def plan_verdict(ctx: RuleContext, base: QuantizedBase) -> PlanVerdict:
    """bf16 LoRA against the quantized base, from the planner, at the run's model, row length and micro-batch."""
    env = ctx.env
    if env.device == Device.CPU:
        return PlanVerdict(why="a CPU run has no GPU memory to plan")
    gpu_bytes = env.gpu_memory_bytes or (ctx.gpu.memory_gib * GIB if ctx.gpu else None)
    if not gpu_bytes:
        return PlanVerdict(why="the GPU's memory is not known (`--gpu` names it)")
    seq = ctx.metrics.seq_len or env.max_seq_len
    setup = setup_for_run(env, seq=round(seq or 0), gpus=ctx.profile.world_size)
    if setup is None or not has_shape(setup):
        return PlanVerdict(why="the model's shape or the row length is not known (a config.json gives it)")
    if (
        setup.method == "full"
    ):  # the run did not say what it trains: adapters of rank LORA_RANK on every linear
        setup = replace(setup, lora_params=_analytic(setup.model, "lora", LORA_RANK).trainable)
    bf16 = memory(replace(setup, method="lora"), gpu_bytes).total
    quantized: float | None = None
    fits: int | None = None
    if base.bits == 4:  # the planner models a 4-bit base (QLoRA); an 8-bit one it does not
        qlora = replace(setup, method="qlora")
        quantized = memory(qlora, gpu_bytes).total
        fits = largest_micro_batch(qlora, FIT_SHARE * gpu_bytes)
    return PlanVerdict(
        gpu_gib=gpu_bytes / GIB,
        bf16_gib=bf16 / GIB,
        quantized_gib=None if quantized is None else quantized / GIB,
        micro_batch=setup.micro_batch,
        micro_batch_fits=fits,
    )


def _described(base: QuantizedBase) -> str:
    bits = f"{base.bits}-bit " if base.bits else ""
    kind = f"{base.quant_type} " if base.quant_type and base.quant_type != "int8" else ""
    nested = ", scales quantized again" if base.double_quant else ""
    compute = f", multiplied in {base.compute_dtype}" if base.compute_dtype else ""
    return f"{bits}{kind}({base.library or 'quantized'}{nested}{compute})"


@cause(
    CauseId.QUANTIZED_BASE,
    title="A quantized base trades speed for memory",
    because=(
        "the base model's linears hold quantized weights (bitsandbytes 4 / 8-bit, torchao), so every matmul "
        "dequantizes its weight first, forward and backward: the memory saved is paid for in every step, "
        "worth it only where the memory is needed"
    ),
    needs_gpu=False,
    needs=((Evidence.PROCESS, Evidence.SETTINGS),),
    fires_when=(
        "the probe found quantized linears in the model (bitsandbytes Linear4bit / Linear8bitLt, a torchao "
        "quantized weight); at confidence {CONFIG_CONFIDENCE:.2f} a config's quantization_config or "
        "load_in_4bit / load_in_8bit. Severity low, medium from {MEDIUM_SHARE:.0%} of the step: a trade, "
        "never high"
    ),
    estimate=(
        "under `doctor` and `tune`: one quantized linear of each weight shape timed after the window on the job's "
        "device at its tokens per micro-batch, forward and backward of the input gradient (and the recompute "
        "with activation checkpointing), as the job runs it and as a dense linear in the compute dtype; the "
        "difference × layers × micro-batches is removed from the step (step / (step − dequantization)), the "
        "paths timed in interleaved pairs until stable (severity from the range's lower end; noisy: "
        "confidence {NOISY_CONFIDENCE}). The "
        "planner says whether bf16 LoRA fits under {FIT_SHARE:.0%} of the GPU at the same micro-batch and the "
        "largest micro-batch the 4-bit base fits. From a config alone: not estimated"
    ),
    remedies=(RemedyId.BF16_LORA,),
)
def quantized_base(ctx: RuleContext) -> Finding | None:
    rank = next((r for r in ctx.profile.ranks if r.quantized_base is not None), None)
    if rank is not None and rank.quantized_base is not None:
        return _found(ctx, rank, rank.quantized_base)
    if ctx.profile.source in WATCHED and ctx.measured:
        return None  # the probe looked at the model and found no quantized linear
    if ctx.env.quantized_base is not None:
        return _found(ctx, None, ctx.env.quantized_base)
    return None


def _found(ctx: RuleContext, rank: RankProfile | None, base: QuantizedBase) -> Finding:
    plan = plan_verdict(ctx, base)
    evidence: dict[str, object] = {
        "library": base.library,
        "quant_type": base.quant_type,
        "bits": base.bits,
        "double_quant": base.double_quant,
        "compute_dtype": base.compute_dtype,
        "layers": base.layers,
        "params_quantized": base.params_quantized,
        "set_by": base.set_by,
    }
    timed = _timed(rank, base)
    est: float | None = None
    share: float | None = None
    share_low: float | None = None  # the conservative end of the timed share's range: it grades the severity
    noisy_clause = ""
    if timed is not None:
        share, share_low, basis, measured, noisy_clause = timed
        est = amdahl(share, float("inf"))
        evidence.update(measured)
        confidence = NOISY_CONFIDENCE if noisy_clause else TIMED_CONFIDENCE
    elif rank is not None and base.layers:
        basis = "not estimated: the quantized linears were found but not timed (only doctor's and tune's windows time them)"
        confidence = UNTIMED_CONFIDENCE
    else:
        basis = (
            "not estimated: a config says the base is quantized, not what its dequantization costs; "
            "`pitstop doctor` times it on the job's device"
        )
        confidence = CONFIG_CONFIDENCE
    evidence.update(plan.evidence())
    layers = f"{base.layers} linears" if base.layers else "linears"
    where = f" ({base.set_by})" if rank is None and base.set_by else ""
    cost = ""
    if timed is not None and share is not None and base.dequant_s_per_step is not None:
        cost = f" — {base.dequant_s_per_step * 1000:.1f} ms of each step ({share:.0%})"
    summary = (
        f"You trade speed for memory: the base model's {layers} hold {_described(base)} weights{where}, "
        f"dequantized at every matmul, forward and backward{cost}. {plan.sentence(base.bits or 4)}"
    )
    if noisy_clause:
        summary += f" Its cost was {noisy_clause}."
    severity = Severity.MEDIUM if share_low is not None and share_low >= MEDIUM_SHARE else Severity.LOW
    if plan.bf16_fits is False and not (
        plan.micro_batch_fits and plan.micro_batch_fits > (plan.micro_batch or 0)
    ):
        # the quantized base is what makes it fit and leaves no room: the trade is right
        severity = Severity.LOW
    return Finding(
        cause=CauseId.QUANTIZED_BASE,
        severity=severity,
        confidence=confidence,
        summary=summary,
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=advise(
            ctx.framework,
            use(
                RemedyId.BF16_LORA,
                bf16_fits=plan.bf16_fits,
                bf16_gib=plan.bf16_gib,
                gpu_gib=plan.gpu_gib,
                micro_batch=plan.micro_batch,
                micro_batch_fits=plan.micro_batch_fits,
                bits=base.bits,
                compute_dtype=base.compute_dtype,
            ),
        ),
    )


def _timed(
    rank: RankProfile | None, base: QuantizedBase
) -> tuple[float, float, str, dict[str, object], str] | None:
    """The dequantization's share of the step from the probe's timing, its range's lower end (the timed pairs'
    quartiles), its basis, its evidence, and the clause that says the timing was noisy ("" if stable)."""
    if rank is None or not rank.steps or base.dequant_s_per_step is None or base.quantized_s is None:
        return None
    step_s = rank.wall_s / len(rank.steps)
    if step_s <= 0:
        return None
    share = min(base.dequant_s_per_step / step_s, MAX_SHARE)
    dense_s = base.dense_s or 0.0
    where = "GPU" if str(base.timed_on or "").startswith("cuda") else "CPU"
    passes = "forward and backward of the input gradient" + (
        " and the checkpointed recompute" if (base.passes or 2) > 2 else ""
    )
    micro = base.micro_batches or 1

    def share_at(ratio: float) -> float:
        """The share if the quantized linears took ``ratio`` × the dense ones' time."""
        return min(max(0.0, ratio - 1.0) * dense_s * micro / step_s, MAX_SHARE)

    point = base.quantized_s / dense_s if dense_s > 0 else None
    low, high = (share, share) if point is None else estimate_band(point, base.spread, share_at)
    low, high = min(low, share), max(high, share)
    est_low, est_high = amdahl(low, float("inf")), amdahl(high, float("inf"))
    said = how_timed(base.spread, est_low, est_high) if point is not None else ""
    basis = (
        f"the {base.layers} quantized linears timed on this {where} after the window at the job's "
        f"{base.tokens_timed} tokens per micro-batch ({base.compute_dtype}, {passes}): "
        f"{base.quantized_s * 1000:.1f} ms as the job runs them, {dense_s * 1000:.1f} ms as dense linears"
        + (f" × {micro} micro-batches" if micro > 1 else "")
        + f" = {base.dequant_s_per_step * 1000:.1f} ms of the {step_s * 1000:.0f} ms step; step / (step − that)"
        + ("" if base.quantized_s > dense_s else " (the quantized linears were not slower here)")
        + (f"; {said}" if said else "")
    )
    measured: dict[str, object] = {
        "dequant_ms_per_step": round(base.dequant_s_per_step * 1000, 3),
        "dequant_share": round(share, 4),
        "quantized_ms_per_micro_batch": round(base.quantized_s * 1000, 3),
        "dense_ms_per_micro_batch": round(dense_s * 1000, 3),
        "dequantize_only_ms_per_micro_batch": None
        if base.dequant_s is None
        else round(base.dequant_s * 1000, 3),
        "timed_on": base.timed_on,
        "tokens_timed": base.tokens_timed,
        **spread_evidence(base.spread, est_low, est_high, "quantized_over_dense"),
    }
    return share, low, basis, measured, said if noisy(base.spread) else ""
