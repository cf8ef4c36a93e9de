"""Spending tune's budget on fixes: how precise each window must be, what the budget covers, and which
baselines a candidate is compared with.

A window stops once its step time is known to ``precision`` (``probe.stopping``). Baselines need the
tightest figure; a candidate whose finding predicts a large gain can be told from noise with a looser one
(sequential testing: a ×1.5 fix does not need ±2.5% to be seen). The baseline is measured again right after
the first candidate (A/B/A: whether the job repeats its own losses and speed is known before any fix is
judged), then after every ``BASELINE_EVERY`` candidates and once at the end; each candidate is judged against
the mean of the baselines measured right before and after it, or, where the budget ran out before a
re-measure, against the single one before it with its band widened by the drift.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pitstop.tune.proposals import Proposal
from pitstop.tune.verdict import UNMEASURED_DRIFT, Baseline, make_baseline, widened
from pitstop.tune.window import Window

BASELINE_PRECISION = 0.025  # ±2.5% (95%) on the baseline's mean step time
LOOSEST_PRECISION = 0.08
BASELINE_EVERY = 2  # candidates between two baselines, after the first (which a baseline follows at once)


def candidate_precision(proposal: Proposal) -> float:
    """A quarter of the gain its finding predicts, between the baseline's precision and ±8%."""
    if not proposal.expected or proposal.expected <= 1.0:
        return 0.04
    return min(max((proposal.expected - 1.0) / 4.0, BASELINE_PRECISION), LOOSEST_PRECISION)


@dataclass(frozen=True)
class BudgetPlan:
    tried: list[str]  # the candidates the budget is planned to cover, in order
    left_out: list[str]
    window_s: float
    needed_s: float  # the budget that would cover every candidate
    text: str


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def baseline_due(trials_done: int) -> bool:
    """Whether a baseline follows the ``trials_done``-th candidate: the first (the job's repeatability), then
    every ``BASELINE_EVERY``."""
    return trials_done == 1 or (trials_done > 1 and (trials_done - 1) % BASELINE_EVERY == 0)


def baselines_after(candidates: int) -> int:
    """Baseline windows among and after ``candidates`` candidates, the closing one included."""
    due = [i for i in range(1, candidates + 1) if baseline_due(i)]
    return len(due) + (1 if candidates and candidates not in due else 0)


def windows_cost(candidates: int, window_s: float) -> float:
    """Candidates and the baselines around them (the closing one included), at one window's length each."""
    return (candidates + baselines_after(candidates)) * window_s


def budget_for(candidates: int, window_s: float, first_s: float) -> float:
    """The budget that measures ``candidates`` fixes: the first window, the candidates with the baselines
    around them, and a tenth for starting each."""
    return (first_s + windows_cost(candidates, window_s)) * 1.1


def budget_plan(proposals: Sequence[Proposal], scout: Window, left_s: float) -> BudgetPlan:
    """Which candidates the rest of the budget covers at the first window's length."""
    window_s = max(scout.seconds, 1.0)
    names = [str(p.fix) for p in proposals]
    fit = 0
    while fit < len(names) and windows_cost(fit + 1, window_s) <= left_s:
        fit += 1
    tried, left_out = names[:fit], names[fit:]
    needed = budget_for(len(names), window_s, scout.seconds)
    step = _step_s(scout)
    pace = (
        f"at {step:.2g} s/step a window takes ~{_duration(window_s)}"
        if step
        else f"a window takes ~{_duration(window_s)}"
    )
    again = "the baseline measured again after the first fix and every " + f"{BASELINE_EVERY} after it"
    if not names:
        text = "no fix to try: the diagnosis proposed none"
    elif not left_out:
        text = f"{pace}: the budget covers all {len(names)} fixes ({', '.join(tried)}), {again}"
    else:
        covered = ", ".join(tried) if tried else "none of them"
        text = (
            f"{pace}: the {_duration(left_s + scout.seconds)} budget tries {covered}, {again}; the other "
            f"{len(left_out)} ({', '.join(left_out)}) need --budget {_duration(needed)}"
        )
    return BudgetPlan(tried, left_out, window_s, needed, text)


def _step_s(window: Window) -> float | None:
    if window.diagnosis is None:
        return None
    ranks = [r for r in window.diagnosis.profile.ranks if r.steps]
    return statistics.median(s.wall_s for r in ranks for s in r.steps) if ranks else None


def bracketing(baselines: list[tuple[int, Window]], position: int, overall: Baseline, tol: float) -> Baseline:
    """The baseline a candidate at ``position`` is compared with: the mean of the baseline windows right
    before and after it (the drift between them counts as uncertainty); with only one of them (the budget ran
    out before a re-measure), that single point with its band widened by the drift the baselines showed (or
    ``UNMEASURED_DRIFT`` when the baseline ran once); else the overall one."""
    before = [w for p, w in baselines if p < position and w.ok]
    after = [w for p, w in baselines if p > position and w.ok]
    near = ([before[-1]] if before else []) + ([after[0]] if after else [])
    if not near:
        return overall
    local = make_baseline(near, tol)
    if len(near) == 1:
        drift = overall.disagreement if overall.disagreement is not None else UNMEASURED_DRIFT
        local = widened(local, drift)
    local.losses = overall.losses
    local.losses_reproducible = overall.losses_reproducible
    local.losses_spread = overall.losses_spread
    local.loss_runs = overall.loss_runs
    return local
