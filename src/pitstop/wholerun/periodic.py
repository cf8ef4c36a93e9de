"""Periodic stalls: steps far slower than their neighbours that recur every P steps (evaluation, checkpoint
saves, logging, an epoch boundary's DataLoader restart), found by their period in the step-time series.

A stall is a step whose time exceeds its window's median by half again and by several robust deviations; only
stalls are kept (a few per window), so the search over a whole run costs memory in stalls, not in steps.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from pitstop.core.profile import StepRecord
from pitstop.core.vocabulary import Phase

STALL_RATIO = 1.5  # a stall takes at least this many times the window's median step
STALL_SIGMAS = 6.0  # ... and exceeds it by this many robust standard deviations
MIN_REPEATS = 4
MAX_EXCESS_CV = 0.5  # a periodic stall costs about the same each time; a busy machine's hiccups do not
MIN_HIT_SHARE = 0.8  # of the period's positions inside the observed range, the share that must be stalls


@dataclass(frozen=True)
class Stall:
    step: int
    excess_s: float  # seconds over the window's median step
    part: Phase  # the part of the step that grew most


def find_stalls(steps: list[StepRecord]) -> list[Stall]:
    """The stalls of one window of one rank's steps."""
    if len(steps) < 4:
        return []
    walls = [s.wall_s for s in steps]
    median = statistics.median(walls)
    mad = statistics.median(abs(w - median) for w in walls) * 1.4826
    part_medians = {name: statistics.median(getattr(s, name) or 0.0 for s in steps) for name in Phase}
    out = []
    for s in steps:
        excess = s.wall_s - median
        if s.wall_s >= STALL_RATIO * median and excess > STALL_SIGMAS * mad:
            grown = {name: (getattr(s, name) or 0.0) - part_medians[name] for name in Phase}
            part = max(grown, key=lambda k: grown[k])
            out.append(Stall(s.index, excess, part))
    return out


@dataclass
class PeriodicStall:
    period: int
    first_step: int
    steps: list[int]  # the stalls it explains
    mean_excess_s: float
    part: Phase
    share_of_time: float | None = None  # of the whole run's step time, when known
    label: str | None = None  # "evaluation (eval_steps=500)" when a configured period matches

    @property
    def where(self) -> str:
        return self.part.where_explained

    def describe(self) -> str:
        what = self.label or "a stall"
        share = "" if self.share_of_time is None else f", {self.share_of_time:.1%} of the run's step time"
        return (
            f"{what} every {self.period} steps from step {self.first_step}: +{self.mean_excess_s:.2f} s each, "
            f"{self.where} ({len(self.steps)} times{share})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "period": self.period,
            "first_step": self.first_step,
            "count": len(self.steps),
            "steps": self.steps[:50],
            "mean_excess_s": round(self.mean_excess_s, 4),
            "part": self.part,
            "share_of_time": self.share_of_time,
            "label": self.label,
            "text": self.describe(),
        }


@dataclass
class StallLog:
    """Every stall of the run so far (bounded: the oldest go first past ``limit``) and the steps observed."""

    limit: int = 20_000
    stalls: list[Stall] = field(default_factory=list)
    first_step: int | None = None
    last_step: int | None = None

    def add(self, window_steps: list[StepRecord]) -> None:
        if not window_steps:
            return
        if self.first_step is None:
            self.first_step = window_steps[0].index
        self.last_step = window_steps[-1].index
        self.stalls += find_stalls(window_steps)
        del self.stalls[: max(0, len(self.stalls) - self.limit)]


def _hits(at: set[int], offset: int, period: int, first: int, last: int) -> tuple[list[int], int]:
    """Stalls on offset + k·period (±1 step: a stall may land in the step after its trigger) and positions."""
    hits, positions = [], 0
    start = offset + ((first - offset + period - 1) // period) * period if first > offset else offset
    for pos in range(start, last + 1, period):
        positions += 1
        near = next((p for p in (pos, pos + 1, pos - 1) if p in at), None)
        if near is not None:
            hits.append(near)
    return hits, positions


def periodic_stalls(
    log: StallLog, known: dict[str, int | None] | None = None, total_s: float | None = None
) -> list[PeriodicStall]:
    """Periods that explain recurring stalls, largest first; ``known`` maps a label ("evaluation") to a
    configured period (the Trainer's eval_steps) so a matching period is named."""
    if log.first_step is None or log.last_step is None or len(log.stalls) < MIN_REPEATS:
        return []
    by_step = {s.step: s for s in log.stalls}
    at = set(by_step)
    ordered = sorted(at)
    candidates: set[int] = set()
    for i, a in enumerate(ordered):
        for b in ordered[i + 1 : i + 6]:
            if b - a >= 2:
                candidates.add(b - a)
    found: list[PeriodicStall] = []
    explained: set[int] = set()
    while True:
        best: tuple[int, int, list[int]] | None = None
        for period in sorted(candidates):
            for offset in {s % period for s in ordered if s not in explained}:
                hits, positions = _hits(at, offset, period, log.first_step, log.last_step)
                fresh = [h for h in hits if h not in explained]
                if len(fresh) < MIN_REPEATS or positions == 0 or len(hits) / positions < MIN_HIT_SHARE:
                    continue
                costs = [by_step[h].excess_s for h in fresh]
                if statistics.pstdev(costs) > MAX_EXCESS_CV * statistics.fmean(costs):
                    continue
                if best is None or len(fresh) > len(best[2]):
                    best = (period, offset, fresh)
        if best is None:
            break
        period, _, hits = best
        explained.update(hits)
        stalls = [by_step[h] for h in sorted(hits)]
        parts = [s.part for s in stalls]
        excess = statistics.fmean(s.excess_s for s in stalls)
        found.append(
            PeriodicStall(
                period=period,
                first_step=stalls[0].step,
                steps=[s.step for s in stalls],
                mean_excess_s=excess,
                part=max(set(parts), key=parts.count),
                share_of_time=None if not total_s else excess * len(stalls) / total_s,
                label=_label(period, known or {}),
            )
        )
    return sorted(found, key=lambda p: -p.mean_excess_s * len(p.steps))


def _label(period: int, known: dict[str, int | None]) -> str | None:
    for label, configured in known.items():
        if configured and configured == period:
            return f"{label} (every {configured} steps as configured)"
    return None
