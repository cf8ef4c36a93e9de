"""An online RL trainer's rollouts take most of every step: the GPU spends the step sampling completions one token
at a time and trains on them for a small part of it.

TRL's GRPOTrainer, RLOOTrainer and OnlineDPOTrainer (and their kin) generate their training data inside the
step: ``num_generations`` completions per prompt, up to ``max_completion_length`` tokens each, with the model's
own ``generate()`` unless ``use_vllm=True``. Decoding is sequential and, at the batch sizes of a training step,
bound by memory traffic and kernel launches rather than by compute, so it easily dwarfs the forward and
backward over the same tokens. The live probe times every generation call in the step (``Phase.GENERATE``,
``StepRecord.generate_s``), counts what it returned (``RankProfile.generation``) and reads the trainer's rollout
settings (``Environment.rl``); a saved GRPOConfig / RLOOConfig read by ``pitstop check`` / ``analyze`` gives the
settings alone, a finding at a lower confidence.
"""

from __future__ import annotations

from pitstop.core.findings import Finding, Use, use
from pitstop.core.profile import GenerationStats, RlSettings
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, Severity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.remedies import advise

SHARE_MIN = 0.30  # generation's share of the step from which the rollouts are the thing to speed up
SHARE_HIGH = 0.60  # ... from which they are most of the step (severity HIGH)
SHARE_MEDIUM = 0.40  # ... from which they are a large part of it (severity MEDIUM)
TRAINER_CONFIDENCE = 0.9  # a recognised online RL trainer's generation calls, timed inside every step
LOOP_CONFIDENCE = 0.6  # generate() timed inside the training steps of a loop not recognised as an RL trainer
CONFIG_CONFIDENCE = 0.35  # a config's rollout settings alone: how long generation takes is not known


def _mean_generate_s(ctx: RuleContext) -> float | None:
    values = [s.generate_s for r in ctx.profile.ranks for s in r.steps]
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None) / len(values)


def _stats(ctx: RuleContext) -> GenerationStats | None:
    return next((r.generation for r in ctx.profile.ranks if r.generation is not None), None)


def _engine(stats: GenerationStats | None, rl: RlSettings | None) -> str | None:
    """What generated: the entry point called most, else what the settings say."""
    if stats is not None and stats.calls_by:
        return max(stats.calls_by, key=lambda k: stats.calls_by[k])
    if rl is not None and rl.use_vllm is not None:
        return f"vLLM ({rl.vllm_mode or 'colocate'})" if rl.use_vllm else "transformers generate"
    return None


def _remedy(rl: RlSettings | None) -> Use:
    return use(
        RemedyId.FASTER_GENERATION,
        trainer=None if rl is None else rl.trainer,
        use_vllm=None if rl is None else rl.use_vllm,
        vllm_mode=None if rl is None else rl.vllm_mode,
        num_generations=None if rl is None else rl.num_generations,
        max_completion_length=None if rl is None else rl.max_completion_length,
        generation_batch_size=None if rl is None else rl.generation_batch_size,
        continuous_batching=None if rl is None else rl.continuous_batching,
    )


def _settings(rl: RlSettings | None) -> dict[str, object]:
    if rl is None:
        return {"trainer": None}
    return {
        "trainer": rl.trainer,
        "use_vllm": rl.use_vllm,
        "vllm_mode": rl.vllm_mode,
        "continuous_batching": rl.continuous_batching,
        "num_generations": rl.num_generations,
        "generation_batch_size": rl.generation_batch_size,
        "steps_per_generation": rl.steps_per_generation,
        "max_completion_length": rl.max_completion_length,
    }


@cause(
    CauseId.RL_GENERATION,
    title="RL rollouts dominate the step",
    because=(
        "an online RL trainer (TRL's GRPO, RLOO, online DPO) samples its training completions inside every step, "
        "one token at a time; with the model's own generate() that decoding is bound by memory traffic and "
        "kernel launches, not compute, and takes most of the step while the training on those completions is a "
        "small part of it"
    ),
    needs_gpu=False,
    needs=((Evidence.PROCESS, Evidence.SETTINGS),),
    fires_when=(
        "the probe timed the generation calls inside the measured steps (generate(), vLLM) at ≥ {SHARE_MIN:.0%} "
        "of step time (high from {SHARE_HIGH:.0%}); confidence {TRAINER_CONFIDENCE:.2f} in a recognised online "
        "RL trainer, {LOOP_CONFIDENCE:.2f} for generate() in another loop's steps; from a saved GRPO / RLOO / "
        "online DPO config that generates without vLLM, at {CONFIG_CONFIDENCE:.2f} (the settings only)"
    ),
    estimate=(
        "not estimated: how much faster vLLM (or continuous batching) generates this model at this batch than "
        "generate() depends on the model, the batch and the GPU, and pitstop does not measure the other engine; "
        "the evidence gives the ceiling, the step with generation taking no time, and the measured generation "
        "rate"
    ),
    remedies=(RemedyId.FASTER_GENERATION,),
)
def rl_generation(ctx: RuleContext) -> Finding | None:
    share = ctx.metrics.generate_frac
    if share is not None:
        return _measured(ctx, share)
    if ctx.measured:
        return None  # steps measured without generation watched: nothing generated in them
    return _configured(ctx)


def _measured(ctx: RuleContext, share: float) -> Finding | None:
    if share < SHARE_MIN:
        return None
    m, rl, stats = ctx.metrics, ctx.env.rl, _stats(ctx)
    steps = m.steps_measured or 1
    parts = (m.forward_frac, m.backward_frac, m.optimizer_frac)
    training = sum(p for p in parts if p is not None) if all(p is not None for p in parts) else None
    gen_s = _mean_generate_s(ctx)
    engine = _engine(stats, rl)
    ceiling = amdahl(share, float("inf"))
    per_step = stats.tokens / steps if stats is not None and stats.tokens is not None else None
    rate = stats.tokens / stats.seconds if stats is not None and stats.tokens and stats.seconds > 0 else None
    evidence: dict[str, object] = {
        "generation_share": round(share, 4),
        "training_share": None if training is None else round(training, 4),
        "generate_s_per_step": None if gen_s is None else round(gen_s, 4),
        "step_time_s": None if m.step_time_s is None else round(m.step_time_s, 4),
        "generate_calls_per_step": None if stats is None else round(stats.calls / steps, 3),
        "steps_generating": None if stats is None else stats.steps_generating,
        "steps_measured": m.steps_measured,
        "completions_per_step": None
        if stats is None or stats.sequences is None
        else round(stats.sequences / steps, 2),
        "tokens_generated_per_step": None if per_step is None else round(per_step, 1),
        "generated_tokens_per_s": None if rate is None else round(rate, 1),
        "engine": engine,
        **_settings(rl),
        "ceiling_speedup": round(ceiling, 3),
    }
    who = f"{rl.trainer}'s" if rl is not None and rl.trainer else "The training loop's"
    train = f", training on them {training:.0%}" if training is not None else ""
    how = f" with {engine}" if engine else ""
    summary = (
        f"{who} rollouts take {share:.0%} of every step{how}{train}: the step waits on sampling completions "
        f"token by token. Were generation free, the step would be ×{ceiling:.1f} faster; a faster engine "
        "(vLLM), fewer or shorter completions buy part of that."
    )
    if rl is not None and rl.use_vllm:
        summary += (
            f" vLLM is already in use ({rl.vllm_mode or 'colocate'} mode): its batch and placement are left."
        )
    return Finding(
        cause=CauseId.RL_GENERATION,
        severity=severity_for(share, SHARE_HIGH, SHARE_MEDIUM),
        confidence=TRAINER_CONFIDENCE if rl is not None else LOOP_CONFIDENCE,
        summary=summary,
        evidence=evidence,
        est_speedup=None,
        speedup_basis=(
            f"not estimated: generation was timed at {share:.1%} of the step, but how much faster vLLM or "
            "continuous batching would generate this model at this batch depends on the model, the batch and "
            f"the GPU, which pitstop did not measure; the ceiling, generation taking no time, is ×{ceiling:.2f}"
        ),
        fix=advise(ctx.framework, _remedy(rl)),
    )


def _configured(ctx: RuleContext) -> Finding | None:
    rl = ctx.env.rl
    if rl is None or rl.use_vllm is not False or rl.continuous_batching:
        return None  # vLLM or continuous batching already asked for: the settings alone say nothing more
    sources = list(ctx.env.config_sources)
    said = f" ({', '.join(sources)})" if sources else ""
    size = (
        f"{rl.num_generations} completions per prompt of up to {rl.max_completion_length} tokens"
        if rl.num_generations and rl.max_completion_length
        else "its completions"
    )
    return Finding(
        cause=CauseId.RL_GENERATION,
        severity=Severity.MEDIUM,
        confidence=CONFIG_CONFIDENCE,
        summary=(
            f"The run's configuration{said} is an online RL trainer's that generates {size} with the model's own "
            "generate() (use_vllm=False): in such runs sampling usually takes most of each step. `pitstop "
            "doctor` on the job times the generation against the training."
        ),
        evidence={**_settings(rl), "config_sources": sources},
        est_speedup=None,
        speedup_basis=(
            "not estimated: a config does not say how long generation takes against the training; pitstop "
            "doctor times both"
        ),
        fix=advise(ctx.framework, _remedy(rl)),
    )
