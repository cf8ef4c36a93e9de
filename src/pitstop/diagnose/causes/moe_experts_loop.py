"""A mixture-of-experts model that runs its experts one after another.

Transformers (>= 5) computes the experts of its MoE models (Mixtral, Qwen2/3-MoE, DeepSeek-V3, OLMoE, GPT-OSS,
...) with two grouped GEMMs over all experts (``experts_implementation="grouped_mm"``, its default) unless the
job asks for ``"eager"``, the class's own loop: per expert hit, a gather of its tokens, two small GEMMs and a
scatter back, forward and backward; and ``grouped_mm`` itself loops per expert where torch has no kernel for it
(an old torch, a GPU below Ampere). Transformers < 5, remote code and hand-written models loop over an
``nn.ModuleList`` of experts. Each expert's GEMM is small, so the GPU idles between launches (the 10-20% SM
activity users report).

The live probe (``RankProfile.experts``) reads the implementation from the model, times the expert modules in
the measured steps (forward and backward) and, at the window's end, one module's loop against ``grouped_mm`` at
the job's tokens on its device. A config alone (``experts_implementation`` in a training config, an old
Transformers in the versions, a model config with experts) names the loop without a cost.
"""

from __future__ import annotations

from pitstop.core.findings import Finding, use
from pitstop.core.profile import ExpertsInfo, RankProfile
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, Severity, Source
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.diagnose.timed import estimate_band, how_timed, noisy, spread_evidence
from pitstop.remedies import advise

MIN_SHARE = 0.10  # the experts' share of the measured step below which the loop is not worth a finding
MIN_SPEEDUP = 1.05  # an estimated gain below this is not reported
MAX_SHARE = 0.95  # a share is capped here: the step always has more than its experts
# grouped GEMMs' gain on the experts where it could not be timed; basis: pitstop's CPU run of a tiny Mixtral
# (32 experts of 64x128, top-2, 512 tokens a call, fp32) gave x7 per call and x3.3 on the step; a GPU pays a
# launch per expert besides. A conservative x3
GROUPED_SPEEDUP = 3.0  # grouped over looped experts where not timed: a tiny Mixtral on a CPU gave x7 a call
LIVE_CONFIDENCE = 0.9  # the implementation read off the model, the experts and the switch timed in the job
NOISY_CONFIDENCE = 0.7  # as LIVE, but the switch's timing did not settle (or ran beside other work)
ASSUMED_CONFIDENCE = 0.75  # the loop seen and the experts timed in the job; the gain of grouping assumed
UNTIMED_CONFIDENCE = 0.6  # the loop seen in the job, the experts not timed (a compiled model)
CONFIG_CONFIDENCE = 0.4  # a config or a version says the experts loop; whether they cost the step not known
LOOPING = ("eager", "loop")  # implementations that run the experts one after another
GROUPED_SINCE = 5  # the first Transformers major version that dispatches experts to grouped_mm by default
# sources whose probe looked for expert layers: there, no ExpertsInfo means a dense model
WATCHED = (Source.DOCTOR, Source.TUNE, Source.WATCH, Source.CALLBACK)


def loops(info: ExpertsInfo) -> bool:
    """Whether the experts run one after another: a loop asked for, or grouped_mm without its kernel here."""
    return info.implementation in LOOPING or info.fallback is not None


def _major(version: str | None) -> int | None:
    head = (version or "").split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _share(rank: RankProfile) -> float | None:
    info = rank.experts
    if info is None or info.experts_s is None or rank.wall_s <= 0:
        return None
    return min(info.experts_s / rank.wall_s, MAX_SHARE)


@cause(
    CauseId.MOE_EXPERTS_LOOP,
    title="MoE experts run one after another",
    because=(
        "the mixture-of-experts layers compute their experts in a loop (Transformers' "
        'experts_implementation="eager", an nn.ModuleList looped over, or grouped_mm without its kernel), '
        "a few small GEMMs per expert with a gather and a scatter each, instead of grouped GEMMs over all "
        "experts at once: the device idles between many small launches"
    ),
    needs_gpu=False,
    needs=((Evidence.PROCESS, Evidence.SETTINGS),),
    fires_when=(
        "the live probe found expert layers running a loop and their forward and backward took ≥ "
        "{MIN_SHARE:.0%} of the measured step, for an estimated gain ≥ ×{MIN_SPEEDUP}; at confidence "
        "{CONFIG_CONFIDENCE:.2f}, without an estimate, where a config asks for experts_implementation "
        "eager or the versions name a Transformers below {GROUPED_SINCE} for a model with experts"
    ),
    estimate=(
        "the experts' share of the step, timed around the expert modules (forward hooks, and the backward "
        "from the output's gradient to the input's) in the measured steps, made faster by the ratio of one "
        "expert module's loop to grouped_mm, timed after the window at the job's tokens on its device in "
        "interleaved pairs until stable (severity from the range's lower end; noisy: confidence "
        "{NOISY_CONFIDENCE}); where "
        "that could not be timed, grouped GEMMs taken as ×{GROUPED_SPEEDUP:.0f} faster. From a config: not "
        "estimated"
    ),
    remedies=(RemedyId.GROUPED_EXPERTS,),
)
def moe_experts_loop(ctx: RuleContext) -> Finding | None:
    watched = [r for r in ctx.profile.ranks if r.experts is not None]
    if watched:
        return _live(ctx, watched)
    if ctx.profile.source in WATCHED:
        return None  # the probe found no expert layer
    return _configured(ctx)


def _live(ctx: RuleContext, watched: list[RankProfile]) -> Finding | None:
    looping = [r for r in watched if r.experts is not None and loops(r.experts)]
    if not looping:
        return None
    info = looping[0].experts
    assert info is not None
    timed = [(r, s) for r in looping if (s := _share(r)) is not None and r.steps]
    share = sum(s for _, s in timed) / len(timed) if timed else None
    if share is not None and share < MIN_SHARE:
        return None
    step_s = sum(r.wall_s / len(r.steps) for r, _ in timed) / len(timed) if timed else None
    switch = [r.experts for r in looping if r.experts and r.experts.loop_s and r.experts.grouped_s]
    timing = switch[0] if switch and info.fallback is None else None
    confidence, est, ratio, basis = _estimate(info, share, step_s, timing)
    if est is not None and est < MIN_SPEEDUP:
        return None
    # the conservative end of a timed switch's range grades the severity; a noisy one lowers the confidence
    est_low, spread_facts, noisy_clause = est, {}, ""
    if timing is not None and share is not None and est is not None and ratio is not None:
        spread = timing.switch_spread
        est_low, est_high = estimate_band(ratio, spread, lambda r: amdahl(share, r))
        spread_facts = spread_evidence(spread, est_low, est_high, "grouped_speedup")
        said = how_timed(spread, est_low, est_high)
        basis += f"; {said}" if said else ""
        if noisy(spread):
            confidence, noisy_clause = min(confidence, NOISY_CONFIDENCE), said
    evidence: dict[str, object] = {
        "implementation": info.implementation,
        "fallback": info.fallback,
        "experts": info.experts,
        "experts_per_token": info.experts_per_token,
        "layers": info.layers,
        "experts_share": None if share is None else round(share, 4),
        "experts_ms_per_step": None if share is None or step_s is None else round(share * step_s * 1000, 3),
        "tokens_per_call": info.tokens_per_call,
        "loop_ms_per_call": _ms(switch[0].loop_s if switch else None),
        "grouped_ms_per_call": _ms(switch[0].grouped_s if switch else None),
        "grouped_speedup": None if ratio is None else round(ratio, 2),
        "recomputed_calls": info.recomputed,
        "site": info.site,
        "transformers_version": info.transformers_version,
        "available": list(info.available),
        **spread_facts,
    }
    how = _how(info)
    cost = f": {share:.0%} of each step goes to the experts" if share is not None else ""
    summary = f"The model's {info.layers} mixture-of-experts layers run their {info.experts or 'N'} experts {how}{cost}."
    if info.recomputed:
        summary += " (Activation checkpointing runs them again in the backward; that time is in the share.)"
    if noisy_clause:
        summary += f" The switch's gain was {noisy_clause}."
    return Finding(
        cause=CauseId.MOE_EXPERTS_LOOP,
        severity=severity_for(1 - 1 / est_low, 0.20, 0.10) if est_low is not None else Severity.MEDIUM,
        confidence=confidence,
        summary=summary,
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=advise(
            ctx.framework,
            use(
                RemedyId.GROUPED_EXPERTS,
                implementation=info.implementation,
                library=info.library,
                transformers_version=info.transformers_version,
                fallback=info.fallback,
                site=info.site,
            ),
        ),
    )


def _estimate(
    info: ExpertsInfo, share: float | None, step_s: float | None, timing: ExpertsInfo | None
) -> tuple[float, float | None, float | None, str]:
    """(confidence, estimated speed-up, grouped's gain on the experts, basis): the experts' measured share
    made faster by the loop-to-grouped ratio timed after the window, else by ``GROUPED_SPEEDUP``."""
    if share is None:
        basis = "not estimated: the expert modules were not timed on this run (a compiled model, or no steps)"
        return UNTIMED_CONFIDENCE, None, None, basis
    took = (
        f"the experts took {share:.1%} of the {(step_s or 0) * 1000:.0f} ms step (forward and backward, timed "
        f"around the {info.layers} expert modules)"
    )
    if timing is not None and timing.loop_s and timing.grouped_s:
        ratio = timing.loop_s / timing.grouped_s
        basis = (
            f"{took}; one module timed after the window at the job's {timing.timed_tokens} tokens per call "
            f"({timing.timed_dtype}, forward and backward): the loop {timing.loop_s * 1000:.2f} ms, grouped_mm "
            f"{timing.grouped_s * 1000:.2f} ms (×{ratio:.1f})"
        )
        return LIVE_CONFIDENCE, amdahl(share, ratio), ratio, basis
    why = (
        "grouped_mm falls back to its loop here, so it could not be timed"
        if info.fallback
        else "no grouped implementation could be timed in the job"
    )
    basis = (
        f"{took}; {why}: grouped GEMMs taken as ×{GROUPED_SPEEDUP:.0f} faster (pitstop's CPU measurement of a "
        "tiny Mixtral gave ×7 per call)"
    )
    return ASSUMED_CONFIDENCE, amdahl(share, GROUPED_SPEEDUP), GROUPED_SPEEDUP, basis


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _how(info: ExpertsInfo) -> str:
    top = f" (top-{info.experts_per_token})" if info.experts_per_token else ""
    if info.fallback:
        return f'one after another{top}: experts_implementation="grouped_mm" falls back to a loop here ({info.fallback})'
    if info.implementation == "eager":
        return f'one after another{top}: experts_implementation="eager", Transformers\' loop over the experts hit'
    old = _major(info.transformers_version)
    where = (
        f" (Transformers {info.transformers_version} has no grouped experts for it)"
        if info.library == "transformers" and old is not None and old < GROUPED_SINCE
        else ""
    )
    return f"one after another{top}: {info.site or 'the block'} loops over an nn.ModuleList of experts{where}"


def _configured(ctx: RuleContext) -> Finding | None:
    env = ctx.env
    model = env.model
    version = env.versions.get("transformers")
    major = _major(version)
    asked = env.experts_implementation
    dense = model.n_layers is not None and not model.n_experts  # a model config without experts
    if asked in LOOPING and not dense:
        said = env.configured_by.get("experts_implementation") or f'experts_implementation="{asked}"'
        why = f"the run's configuration asks for the experts' loop ({said})"
        implementation: str | None = "eager"
    elif major is not None and major < GROUPED_SINCE and model.n_experts:
        why = f"Transformers {version} loops over the experts of every MoE model (grouped experts came in v5)"
        implementation = "loop"
    else:
        return None
    experts = f"{model.n_experts} experts" if model.n_experts else "experts"
    return Finding(
        cause=CauseId.MOE_EXPERTS_LOOP,
        severity=Severity.MEDIUM,
        confidence=CONFIG_CONFIDENCE,
        summary=(
            f"The mixture-of-experts layers would run their {experts} one after another: {why}. Grouped GEMMs "
            "compute every expert at once; `pitstop doctor` on the job times the experts' share of the step."
        ),
        evidence={
            "implementation": implementation,
            "experts": model.n_experts,
            "experts_per_token": model.experts_active,
            "layers": model.n_layers,
            "transformers_version": version,
            "config_sources": list(env.config_sources),
        },
        est_speedup=None,
        speedup_basis=(
            "not estimated: a config does not say how much of the step the experts take; pitstop doctor times "
            "them and the grouped kernel on the job's device"
        ),
        fix=advise(
            ctx.framework,
            use(
                RemedyId.GROUPED_EXPERTS,
                implementation=implementation,
                library="transformers",
                transformers_version=version,
            ),
        ),
    )
