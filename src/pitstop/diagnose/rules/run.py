"""Rules about the run as a whole: time lost to evaluation and checkpoints, GPUs left idle."""

from __future__ import annotations

import statistics

from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.findings import Finding
from pitstop.remedies import RemedyId, advise, use
from pitstop.vocabulary import Severity

EVAL_MIN = 0.10
FREQUENT_STEPS = 50


def eval_overhead(ctx: RuleContext) -> Finding | None:
    env = ctx.env
    share = ctx.metrics.eval_frac
    totals = ctx.profile.totals
    if share is not None:
        if share < EVAL_MIN:
            return None
        evals = totals.evals if totals else None
        return Finding(
            cause="eval_overhead",
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
            cause="eval_overhead",
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
    frequent = [n for n in (env.eval_steps, env.save_steps) if n is not None and n <= FREQUENT_STEPS]
    if frequent and not ctx.measured:
        return Finding(
            cause="eval_overhead",
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


def idle_gpu(ctx: RuleContext) -> Finding | None:
    """A GPU in the log that never worked while the others did."""
    ranks = [r for r in ctx.profile.ranks if r.gpu_samples]
    if len(ranks) < 2:
        return None
    peak = {r.rank: max((s.util or 0.0) for s in r.gpu_samples) for r in ranks}
    mean = {r.rank: statistics.fmean(s.util or 0.0 for s in r.gpu_samples) for r in ranks}
    busy = [k for k, m in mean.items() if m >= 20]
    idle = [k for k, p in peak.items() if p <= 2]
    if not busy or not idle:
        return None
    share = len(idle) / len(ranks)
    return Finding(
        cause="idle_gpu",
        severity=Severity.HIGH,
        confidence=0.85,
        summary=f"GPU {', '.join(map(str, idle))} of {len(ranks)} never did any work while the others were busy.",
        evidence={
            "idle_gpus": idle,
            "busy_gpus": busy,
            "mean_util_pct": {str(k): round(v, 1) for k, v in mean.items()},
        },
        est_speedup=1 / (1 - share),
        speedup_basis="the job could spread over every GPU it holds: GPUs / busy GPUs",
        fix=advise(ctx.framework, use(RemedyId.USE_EVERY_GPU, idle=[str(i) for i in idle])),
    )
