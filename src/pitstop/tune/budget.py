"""Spending tune's budget on fixes: how precise each window must be, what the budget covers, and which
baselines a candidate is compared with.

A window stops once its step time is known to ``precision`` (``probe.stopping``). Baselines need the
tightest figure; a candidate whose finding predicts a large gain can be told from noise with a looser one
(sequential testing: a ×1.5 fix does not need ±2.5% to be seen). Drift is followed by a baseline after every
``BASELINE_EVERY`` candidates and one at the end; each candidate is judged against the baselines measured
right before and after it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pitstop.tune.proposals import Proposal
from pitstop.tune.verdict import Baseline, make_baseline
from pitstop.tune.window import Window

BASELINE_PRECISION = 0.025  # ±2.5% (95%) on the baseline's mean step time
LOOSEST_PRECISION = 0.08
BASELINE_EVERY = 3  # candidates between two baselines


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


def windows_cost(candidates: int, window_s: float) -> float:
    """Candidates and the baselines between them, at one window's length each. The closing baseline comes
    only from what is left: a fix measured against the first baseline is worth more than a drift figure."""
    between = max(candidates - 1, 0) // BASELINE_EVERY
    return (candidates + between) * window_s


def budget_for(candidates: int, window_s: float, first_s: float) -> float:
    """The budget that measures ``candidates`` fixes: the first window, the candidates with the baselines
    between them, a closing baseline, and a tenth for starting each."""
    return (first_s + windows_cost(candidates, window_s) + window_s) * 1.1


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
    if not names:
        text = "no fix to try: the diagnosis proposed none"
    elif not left_out:
        text = f"{pace}: the budget covers all {len(names)} fixes ({', '.join(tried)})"
    else:
        covered = ", ".join(tried) if tried else "none of them"
        text = (
            f"{pace}: the {_duration(left_s + scout.seconds)} budget tries {covered}; the other "
            f"{len(left_out)} ({', '.join(left_out)}) need --budget {_duration(needed)}"
        )
    return BudgetPlan(tried, left_out, window_s, needed, text)


def _step_s(window: Window) -> float | None:
    if window.diagnosis is None:
        return None
    ranks = [r for r in window.diagnosis.profile.ranks if r.steps]
    return statistics.median(s.wall_s for r in ranks for s in r.steps) if ranks else None


def bracketing(baselines: list[tuple[int, Window]], position: int, overall: Baseline, tol: float) -> Baseline:
    """The baseline a candidate at ``position`` is compared with: the baseline windows right before and
    after it (drift between them counts as uncertainty), else the overall one."""
    before = [w for p, w in baselines if p < position and w.ok]
    after = [w for p, w in baselines if p > position and w.ok]
    near = ([before[-1]] if before else []) + ([after[0]] if after else [])
    if not near:
        return overall
    local = make_baseline(near, tol)
    local.losses = overall.losses
    local.losses_reproducible = overall.losses_reproducible
    return local
