"""Shares of time from samples, with the uncertainty they deserve, and steps from sample sequences.

A share from N samples is a binomial proportion: its 95% interval is Wilson's (it stays inside 0..1 and is
honest for shares near 0 or 1 and small N). Samples of one thread taken 10 ms apart are not independent
(phases last longer than a tick), so the interval is a floor on the uncertainty, and is said to be one."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pitstop.attach.classify import Phase

Z95 = 1.959964


@dataclass(frozen=True)
class Share:
    """``hits`` of ``n`` samples: the share and its 95% Wilson interval."""

    hits: int
    n: int

    @property
    def value(self) -> float:
        return self.hits / self.n if self.n else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.hits, self.n)

    def text(self) -> str:
        lo, hi = self.interval
        return f"{self.value:.0%} (95% CI {lo:.0%}–{hi:.0%}, {self.hits}/{self.n} samples)"


def wilson(hits: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion; (0, 1) when there are no samples."""
    if n <= 0:
        return 0.0, 1.0
    p = hits / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def phase_shares(phases: Sequence[Phase]) -> dict[Phase, Share]:
    """Every phase's share of the samples (phases never seen have 0 hits)."""
    n = len(phases)
    return {p: Share(sum(1 for q in phases if q is p), n) for p in Phase}


# the order of one step's phases in a training loop: data, forward, backward, (collectives,) optimizer
_LATE = {Phase.BACKWARD, Phase.OPTIMIZER}
_AFTER_BATCH = {Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER, Phase.COLLECTIVE}


@dataclass(frozen=True)
class StepCount:
    """Step starts (sample indices) and how they were found."""

    starts: list[int]
    method: str  # "optimizer step" or "forward/backward cycles"
    optimizer_entries: int
    resolved: bool = True  # False: the steps' short phases fall between samples, so steps are missed

    @property
    def steps(self) -> int:
        """Whole steps between the first and the last start."""
        return max(0, len(self.starts) - 1)


def optimizer_entries(in_step: Sequence[bool]) -> list[int]:
    """Indices where a run of samples inside the optimizer's step begins (one entry per step seen)."""
    return [i for i, inside in enumerate(in_step) if inside and (i == 0 or not in_step[i - 1])]


def cycle_starts(phases: Sequence[Phase]) -> list[int]:
    """Indices where a new micro-batch begins: the loop fetches a batch after anything but fetching (compute,
    a collective), or starts a forward after a backward / optimizer step (a loader too fast to be sampled).
    Samples of the loop's own code (``OTHER``) are passed over. One per step without gradient accumulation."""
    starts: list[int] = []
    prev: Phase | None = None
    for i, phase in enumerate(phases):
        if phase is Phase.OTHER:
            continue
        if prev is not None and (
            (phase is Phase.DATA and prev in _AFTER_BATCH) or (phase is Phase.FORWARD and prev in _LATE)
        ):
            starts.append(i)
        prev = phase
    return starts


def count_steps(phases: Sequence[Phase], in_step: Sequence[bool]) -> StepCount:
    """Steps from one main thread's samples. An optimizer step shorter than ~2 sampling intervals is often
    missed between two samples, so its entries undercount: then steps are counted as forward/backward cycles
    (exact without gradient accumulation, micro-batches with it). Both are estimates: two steps that fall
    between consecutive samples are one."""
    entries = optimizer_entries(in_step)
    cycles = cycle_starts(phases)
    inside = sum(1 for x in in_step if x)
    sampled_well = len(entries) >= 2 and inside >= 2 * len(entries)
    if sampled_well and len(entries) * 1.3 >= len(cycles):
        # a step starts after its optimizer step ends: the first sample after each entry's run
        ends = [_run_end(in_step, i) for i in entries]
        return StepCount(
            starts=[e for e in ends if e < len(in_step)],
            method="optimizer step",
            optimizer_entries=len(entries),
        )
    # resolved: both sides of each boundary last two samples or more on average (the batch fetch or forward
    # that starts a step, and the compute or collective before it), so few boundaries fall between samples
    late = sum(1 for p in phases if p in _LATE or p is Phase.COLLECTIVE)
    markers = sum(_run_length(phases, i) for i in cycles)
    resolved = len(cycles) >= 2 and late >= 2 * len(cycles) and markers >= 2 * len(cycles)
    return StepCount(
        starts=cycles, method="forward/backward cycles", optimizer_entries=len(entries), resolved=resolved
    )


def _run_length(phases: Sequence[Phase], i: int) -> int:
    j = i
    while j < len(phases) and phases[j] is phases[i]:
        j += 1
    return j - i


def _run_end(in_step: Sequence[bool], i: int) -> int:
    while i < len(in_step) and in_step[i]:
        i += 1
    return i
