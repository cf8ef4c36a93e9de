"""Evaluation (or other periodic pauses) taking a large share of the run's time: from the Trainer's
logs, the rank's own eval time, or periodic idle stretches on the GPU."""

from __future__ import annotations

import statistics

from pitstop.core.findings import Finding, use
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, Severity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.diagnose.gpu_windows import working
from pitstop.remedies import advise

EVAL_MIN = 0.10
FREQUENT_STEPS = 50


@cause(
    CauseId.EVAL_OVERHEAD,
    title="Evaluation and checkpoints eat the run",
    because="evaluation or checkpointing runs so often that it takes a large share of the run's time",
    needs_gpu=False,
    needs=((Evidence.STEPS, Evidence.SETTINGS),),
    fires_when=(
        "Trainer-logged evaluation ≥ {EVAL_MIN:.0%} of the run; or GPU samples that pause at regular "
        "intervals for ≥ {EVAL_MIN:.0%} of the time the job ran"
    ),
    estimate="80% of that time saved",
    remedies=(RemedyId.EVAL_LESS_OFTEN,),
)
def eval_overhead(ctx: RuleContext) -> Finding | None:
    env = ctx.env
    share = ctx.metrics.eval_frac
    totals = ctx.profile.totals
    if share is not None:
        if share < EVAL_MIN:
            return None
        evals = totals.evals if totals else None
        return Finding(
            cause=CauseId.EVAL_OVERHEAD,
            severity=severity_for(share, 0.30, 0.15),
            confidence=0.9,
            summary=(
                f"Evaluation took {share:.0%} of the run"
                + (
                    f" ({evals} evaluations of {totals.eval_s / evals:.0f} s each)"
                    if evals and totals and totals.eval_s
                    else ""
                )
                + "."
            ),
            evidence={
                "eval_frac": round(share, 3),
                "evals": evals,
                "eval_s": None if totals is None or totals.eval_s is None else round(totals.eval_s, 1),
                "eval_steps": env.eval_steps,
                "saves": totals.saves if totals else None,
            },
            est_speedup=amdahl(share * 0.8, float("inf")),
            speedup_basis="Trainer-logged eval_runtime over train_runtime; evaluating 5× less often saves 80% of it",
            fix=advise(
                ctx.framework,
                use(RemedyId.EVAL_LESS_OFTEN, eval_steps=env.eval_steps, save_steps=env.save_steps),
            ),
        )
    if totals is not None and totals.eval_s and not totals.train_s:
        return Finding(
            cause=CauseId.EVAL_OVERHEAD,
            severity=Severity.MEDIUM if (totals.evals or 0) >= 5 else Severity.LOW,
            confidence=0.5,
            summary=(
                f"{totals.evals} evaluations took {totals.eval_s / 60:.1f} minutes so far; the run's total time "
                "is not in this file, so their share is unknown."
            ),
            evidence={"evals": totals.evals, "eval_s": round(totals.eval_s, 1), "eval_steps": env.eval_steps},
            est_speedup=None,
            speedup_basis="no train_runtime yet (a run still in progress?)",
            fix=advise(
                ctx.framework,
                use(RemedyId.EVAL_LESS_OFTEN, eval_steps=env.eval_steps, save_steps=env.save_steps),
            ),
        )
    paused = _periodic_pauses(ctx)
    if paused is not None:
        return paused
    frequent = [n for n in (env.eval_steps, env.save_steps) if n is not None and n <= FREQUENT_STEPS]
    if frequent and not ctx.measured:
        return Finding(
            cause=CauseId.EVAL_OVERHEAD,
            severity=Severity.LOW,
            confidence=0.4,
            summary=(
                "The config evaluates or saves a checkpoint every "
                + " and every ".join(f"{n} steps" for n in frequent)
                + ": with a real model each of those can cost minutes."
            ),
            evidence={
                "eval_steps": env.eval_steps,
                "save_steps": env.save_steps,
                "sources": env.config_sources[:3],
            },
            est_speedup=None,
            speedup_basis="config only",
            fix=advise(
                ctx.framework,
                use(RemedyId.EVAL_LESS_OFTEN, eval_steps=env.eval_steps, save_steps=env.save_steps),
            ),
        )
    return None


def _periodic_pauses(ctx: RuleContext) -> Finding | None:
    """GPU samples: the job stops computing at regular intervals (gpu_windows.py's periodic pauses), the
    pattern of evaluation or checkpointing. Their share is of the time between the first and the last
    busy sample; the lead-in (loading) and the tail are not counted against them."""
    best = None
    for w in working(ctx.results.gpus):
        running = w.span_s - w.lead_in_s - w.tail_s
        if w.pause_period_s is None or running <= 0:
            continue
        share = sum(p.duration_s for p in w.pauses) / running
        if best is None or share > best[0]:
            best = (share, w)
    if best is None or best[0] < EVAL_MIN:
        return None
    share, w = best
    pauses, period = w.pauses, w.pause_period_s or 0.0
    env = ctx.env
    return Finding(
        cause=CauseId.EVAL_OVERHEAD,
        severity=Severity.MEDIUM
        if share >= 0.15
        else Severity.LOW,  # samples show the pauses, not what ran in them
        confidence=0.4,
        summary=(
            f"GPU {w.gpu} stops computing every {period / 60:.1f} min for about "
            f"{statistics.fmean(p.duration_s for p in pauses) / 60:.1f} min ({len(pauses)} pauses, {share:.0%} of "
            "the time the job ran): the pattern of evaluation or checkpointing."
        ),
        evidence={
            "pause_frac": round(share, 3),
            "pauses": len(pauses),
            "pause_s": round(statistics.fmean(p.duration_s for p in pauses), 1),
            "pause_period_s": round(period, 1),
            "gpu": w.gpu,
            "eval_steps": env.eval_steps,
            "save_steps": env.save_steps,
        },
        est_speedup=amdahl(share * 0.8, float("inf")),
        speedup_basis="GPU samples: periodic idle stretches over the time the job ran; evaluating and "
        "checkpointing 5× less often saves 80% of them",
        fix=advise(
            ctx.framework, use(RemedyId.EVAL_LESS_OFTEN, eval_steps=env.eval_steps, save_steps=env.save_steps)
        ),
    )
