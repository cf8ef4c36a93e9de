"""What tune may conclude from its windows. A fix that shows no gain on a machine whose identical baseline
windows disagreed by more than the run resolves was not shown to have none: tune then says the machine was
too noisy to decide, names the undecided fixes and the budget a quieter rerun needs, and never says "keep it as
it is" (issue 27, item 5)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pitstop.tune.budget import budget_for
from pitstop.tune.verdict import UNDECIDED, Baseline, Verdict


@dataclass(frozen=True)
class Undecided:
    """The fixes a noisy machine left undecided, how noisy it was, and what a rerun needs."""

    fixes: list[str]
    disagreement: float  # (fastest − slowest) / mean of the identical baseline windows
    resolvable: float  # the smallest effect the run resolves on a steady machine
    slowest: float  # the baseline windows' slowest and fastest rates
    fastest: float
    rerun_budget_s: float  # the budget that measures the undecided fixes again at this job's pace

    def text(self) -> str:
        fixes = ", ".join(self.fixes)
        return (
            f"the machine was too noisy to decide on {fixes}: identical baseline windows ran between "
            f"{self.slowest:,.0f} and {self.fastest:,.0f} real tokens/s (they disagree by {self.disagreement:.0%}, "
            f"more than the {self.resolvable:.0%} this run resolves); on a quieter machine, "
            f"`pitstop tune --only {','.join(self.fixes)} --budget {_minutes(self.rerun_budget_s)}` measures "
            f"{'it' if len(self.fixes) == 1 else 'them'} again"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "fixes": self.fixes,
            "disagreement": self.disagreement,
            "resolvable": self.resolvable,
            "slowest": self.slowest,
            "fastest": self.fastest,
            "rerun_budget_s": round(self.rerun_budget_s, 1),
        }


def _minutes(seconds: float) -> str:
    return f"{max(1, math.ceil(seconds / 60))}m"


def undecided(
    verdicts: Sequence[Verdict], baseline: Baseline, rates: Sequence[float], window_s: float, first_s: float
) -> Undecided | None:
    """The fixes left undecided by noise (``verdict.judge`` marks them against the baselines around each),
    or None when every measured fix was decided."""
    fixes = [v.fix for v in verdicts if v.status == UNDECIDED]
    if not fixes or len(rates) < 2:
        return None
    disagreement = baseline.disagreement if baseline.disagreement is not None else 0.0
    return Undecided(
        fixes,
        disagreement,
        baseline.resolvable,
        min(rates),
        max(rates),
        budget_for(len(fixes), window_s, first_s),
    )


class Concluded(Protocol):
    """What the conclusion reads of a tune run (a ``TuneResult`` has it; the session builds that result from
    this module's ``undecided``, so this module names the fields it reads rather than the class)."""

    @property
    def verdicts(self) -> Sequence[Verdict]: ...

    @property
    def not_tried(self) -> Sequence[tuple[str, str]]: ...

    @property
    def undecided(self) -> Undecided | None: ...


def no_gain_verdict(result: Concluded) -> str:
    """What tune concludes when it keeps no fix. "Keep it as it is" only when every proposed fix was measured
    and decided; a fix not tried or left undecided by noise is named instead."""
    untried = [fix for fix, _ in result.not_tried]
    measured = [v.fix for v in result.verdicts if v.speedup is not None]
    if result.undecided is not None:
        left = f"; {len(untried)} more were not tried ({', '.join(untried)})" if untried else ""
        return (
            f"No fix was kept, and nothing is decided: {result.undecided.text()}{left}. "
            "Do not conclude that the job is as fast as it gets."
        )
    if untried:
        done = f"Of the fixes tried ({', '.join(measured)}), none" if measured else "No fix"
        return (
            f"{done} measurably sped up this job, but {len(untried)} proposed "
            f"{'fix was' if len(untried) == 1 else 'fixes were'} not tried ({', '.join(untried)}): "
            "give tune a larger --budget (the plan above says how much) before concluding anything."
        )
    if not result.verdicts:
        return "The diagnosis proposed no fix that tune can apply from outside the job."
    return "Every proposed fix was measured and none sped up this job measurably; keep it as it is."
