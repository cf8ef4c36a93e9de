"""Reentrant activation checkpointing where it costs: its recompute runs a whole FSDP unit, whose parameters
FSDP then all-gathers a second time in the backward.

The reentrant variant (``use_reentrant=True``, and torch's default for a call that leaves it unset) runs the
checkpointed function again inside the backward, as a forward of its own, then a nested backward over it.
Where that function calls an FSDP unit (``checkpoint(fsdp_layer, x)``, ``checkpoint_wrapper(REENTRANT)``
applied before FSDP wraps the layers, older Transformers checkpointing ``decoder_layer.__call__``), FSDP1
all-gathers the unit for the recompute, reshards it, and all-gathers it again for the unit's backward; FSDP2
re-runs the forward prefetches set on the unit. The non-reentrant variant recomputes inside the unit's own
backward, so the gather happens once. Measured on two gloo ranks with four checkpointed Llama layers: 13
all-gathers a step against 9 (FSDP1), 12 against 9 (FSDP2 with forward prefetch); with the checkpoint inside
each unit, 9 either way.

Where nothing is re-gathered the variant costs nothing measurable, so the rule stays silent: on one process
the reentrant variant ran as fast or faster (a LoRA tiny Llama with Transformers' checkpointing, 4 layers on a
CPU, reentrant against non-reentrant: 54 against 58 ms, 273 against 275 ms of CPU time a step at two sizes;
the frozen base's extra input gradient that ``enable_input_require_grads`` asks for is one layer's worth). The
live probe counts each repeated all-gather (``RankProfile.checkpointing.regathers``); the estimate prices them
at the window's median all-gather. A configuration that says reentrant on an FSDP run that reshards after
forward (``checkpoint_reentrant``, pitstop check / analyze) is named with low confidence and no estimate:
whether the checkpoint wraps the units is not written there."""

from __future__ import annotations

import statistics

from pitstop.core.findings import Finding, use
from pitstop.core.profile import CollectiveRecord, RankProfile
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, Severity, Sharding
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.remedies import advise

MIN_GAIN = 1.01  # a measured finding below this is not reported: the repeats are cheap on this link
LIVE_CONFIDENCE = 0.8  # the repeats are counted; their time is the median all-gather's, not their own
UNTIMED_CONFIDENCE = 0.6  # the repeats are counted but no all-gather was timed (no estimate)
CONFIG_CONFIDENCE = 0.35  # a configuration alone: reentrant on a resharding FSDP run, placement unknown
RESHARDING = (Sharding.FULL_SHARD, Sharding.HYBRID_SHARD)  # FSDP that all-gathers again in the backward


def _seconds(c: CollectiveRecord) -> float | None:
    if c.done_t is not None:
        return max(c.done_t - c.issued_t, 0.0)
    return c.blocked_s


def _median_all_gather_s(rank: RankProfile) -> tuple[float | None, int]:
    """The window's median all-gather time (the checkpointed layers' units are most of them) and how many
    all-gathers the window ran."""
    first, last = rank.steps[0].index, rank.steps[-1].index
    times = [
        t
        for c in rank.collectives
        if c.op == "all_gather" and first <= c.step <= last and (t := _seconds(c)) is not None
    ]
    gathers = sum(1 for c in rank.collectives if c.op == "all_gather" and first <= c.step <= last)
    return (statistics.median(times) if times else None), gathers


def _needless(ctx: RuleContext) -> bool:
    return any(f.cause == CauseId.NEEDLESS_RECOMPUTE for f in ctx.earlier)


@cause(
    CauseId.REENTRANT_CHECKPOINTING,
    title="Reentrant checkpointing all-gathers each FSDP unit twice",
    because=(
        "the reentrant variant of activation checkpointing recomputes a whole FSDP unit as a forward of its own "
        "inside the backward, so FSDP all-gathers the unit's parameters for the recompute and again for its "
        "backward; the non-reentrant variant recomputes under the one gather"
    ),
    needs_gpu=False,
    needs=((Evidence.PROCESS, Evidence.SETTINGS),),
    fires_when=(
        "the probe saw reentrant checkpointed calls whose recompute re-gathers FSDP parameters (an FSDP1 unit "
        "inside the checkpoint, or an FSDP2 unit's forward prefetches) and those repeats cost ≥ "
        "{MIN_GAIN:.2f}×; or a configuration says use_reentrant=True on an FSDP run that reshards after "
        "forward (confidence {CONFIG_CONFIDENCE:.2f}, no estimate). Reentrant checkpointing that repeats "
        "nothing (one process, the checkpoint inside each unit) is not named: it measured no slower"
    ),
    estimate=(
        "the repeated all-gathers a step (counted) × the window's median all-gather time, as a share of the "
        "step, removed"
    ),
    remedies=(RemedyId.NON_REENTRANT_CHECKPOINTING,),
    reads_findings=True,  # the advice defers to needless_recompute's bigger fix when that fired
)
def reentrant_checkpointing(ctx: RuleContext) -> Finding | None:
    ranks = [r for r in ctx.profile.ranks if r.checkpointing is not None and r.steps]
    if ranks:
        rank = max(ranks, key=lambda r: (r.checkpointing.regathers if r.checkpointing else 0, -r.rank))
        return _live(ctx, rank)
    return _configured(ctx)


def _live(ctx: RuleContext, rank: RankProfile) -> Finding | None:
    ck = rank.checkpointing
    assert ck is not None
    if ck.reentrant == 0 or ck.regathers == 0:
        return None  # non-reentrant, or reentrant where it repeats nothing: measured no slower
    steps = len(rank.steps)
    per_step = ck.regathers / steps
    median_s, gathers = _median_all_gather_s(rank)
    step_s = rank.mean_step_s or 0.0
    evidence: dict[str, object] = {
        "reentrant_calls": ck.reentrant,
        "non_reentrant_calls": ck.non_reentrant,
        "repeated_all_gathers_per_step": round(per_step, 2),
        "all_gathers_per_step": round(gathers / steps, 2),
        "checkpoint_called_from": ck.site,
        "steps_measured": steps,
        "rank": rank.rank,
    }
    est: float | None = None
    basis = "not estimated: no all-gather was timed in the window"
    confidence = UNTIMED_CONFIDENCE
    if median_s is not None and step_s > 0:
        share = min(per_step * median_s / step_s, 1.0)
        evidence.update(median_all_gather_ms=round(median_s * 1000, 2), repeated_share=round(share, 3))
        est = amdahl(share, float("inf"))
        if est < MIN_GAIN:
            return None
        basis = (
            f"{per_step:.1f} repeated all-gathers a step (counted) × the window's median all-gather "
            f"({median_s * 1000:.1f} ms) = {share:.0%} of the {step_s * 1000:.0f} ms step, removed"
        )
        confidence = LIVE_CONFIDENCE
    others = f" on top of {gathers / steps - per_step:.1f}" if gathers / steps > per_step else ""
    summary = (
        f"Activation checkpointing runs its reentrant variant ({ck.reentrant} calls in {steps} measured steps"
        + (f", called from {ck.site}" if ck.site else "")
        + f") around whole FSDP units: each recompute all-gathers its unit's parameters again, "
        f"{per_step:.1f} extra all-gathers a step{others}."
    )
    return Finding(
        cause=CauseId.REENTRANT_CHECKPOINTING,
        severity=severity_for(est, 1.25, 1.05) if est is not None else Severity.MEDIUM,
        confidence=confidence,
        summary=summary,
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=advise(
            ctx.framework,
            use(RemedyId.NON_REENTRANT_CHECKPOINTING, site=ck.site, fsdp=True, needless=_needless(ctx)),
        ),
    )


def _configured(ctx: RuleContext) -> Finding | None:
    env = ctx.env
    sharding = Sharding.parse(env.fsdp_sharding) if env.fsdp_sharding else None
    if not env.checkpoint_reentrant or env.gradient_checkpointing is False or sharding not in RESHARDING:
        return None  # off the FSDP path the reentrant variant measured no slower: nothing to name
    said = (getattr(env, "configured_by", None) or {}).get("checkpoint_reentrant")  # check / analyze's note
    evidence: dict[str, object] = {
        "checkpoint_reentrant": True,
        "fsdp_sharding": str(sharding),
        "configured_by": said,
    }
    return Finding(
        cause=CauseId.REENTRANT_CHECKPOINTING,
        severity=Severity.LOW,
        confidence=CONFIG_CONFIDENCE,
        summary=(
            f"The configuration asks for reentrant activation checkpointing ({said or 'use_reentrant=True'}) "
            f"on an FSDP run that reshards after forward ({sharding}): where a checkpoint holds a whole FSDP "
            "unit, each recompute all-gathers the unit's parameters a second time in the backward."
        ),
        evidence=evidence,
        est_speedup=None,
        speedup_basis=(
            "not estimated: the configuration does not say whether the checkpoints hold whole FSDP units "
            "(`pitstop doctor` counts the repeated all-gathers)"
        ),
        fix=advise(
            ctx.framework,
            use(RemedyId.NON_REENTRANT_CHECKPOINTING, site=None, fsdp=True, needless=_needless(ctx)),
        ),
    )
