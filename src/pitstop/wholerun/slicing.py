"""A window of a run sliced from its profile: steps ``first``..``last`` and what was measured in them, so the
doctor's rules see in a window what they see in a whole run (a window's gc pauses and checkpoint saves too).

What goes with a window, per rank:

* its steps, and the collectives issued in them (by step index);
* the GPU, host and activity samples taken while they ran, by time: the steps' span on the probe's clock
  (``step_span``); a source without step times hands a window its own samples, and all of them go with it;
* the collector's counts charged to its steps: garbage-collector pauses (``StepRecord.gc_pauses``) and
  checkpoint saves (``StepRecord.checkpoints``), summed; the collector's settings (enabled, thresholds, frozen
  and tracked objects) are the rank's;
* the process's facts: rank, environment, how its tokens were counted and its steps delimited.

A figure kept only for the whole window (memory peaks, sync sites, a trace's statistics, gc pauses and saves of
a source that does not charge them to steps) goes with a slice that holds every step of the rank, and is
unknown in a part of it, as for a source that did not measure it: the rules then say nothing of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from pitstop.core.profile import (
    GcGeneration,
    GcPauses,
    GpuActivity,
    MemoryStats,
    RankProfile,
    RunProfile,
    SaveStats,
    StepRecord,
)


def step_span(rank: RankProfile, steps: list[StepRecord]) -> tuple[float, float] | None:
    """When ``steps`` (consecutive steps of ``rank``) ran, on the probe's clock: from their ends (``end_t``),
    else from the rank's window start and the step times before them (steps follow one another without
    gaps); None when neither is known."""
    if not steps:
        return None
    first, last = steps[0], steps[-1]
    if first.end_t is not None and last.end_t is not None:
        return first.end_t - first.wall_s, last.end_t
    if rank.window_start_t is None:
        return None
    start = rank.window_start_t + sum(s.wall_s for s in rank.steps if s.index < first.index)
    return start, start + sum(s.wall_s for s in steps)


def merge_gc(parts: Iterable[GcPauses], settings: GcPauses | None = None) -> GcPauses:
    """Collections of several stretches (steps) added up per generation, with the collector's settings."""
    generations = [GcGeneration() for _ in range(3)]
    automatic = [GcGeneration() for _ in range(3)]
    # every part told the automatic collections apart (an older profile's do not)
    told_apart = settings is None or settings.automatic is not None
    for part in parts:
        for total, g in zip(generations, part.generations, strict=False):
            _add(total, g)
        told_apart = told_apart and part.automatic is not None
        for total, g in zip(automatic, part.automatic or [], strict=False):
            _add(total, g)
    if settings is None:
        return GcPauses(generations, automatic=automatic if told_apart else None)
    return GcPauses(
        generations,
        enabled=settings.enabled,
        thresholds=settings.thresholds,
        frozen=settings.frozen,
        tracked=settings.tracked,
        automatic=automatic if told_apart else None,
    )


def _add(total: GcGeneration, g: GcGeneration) -> None:
    total.collections += g.collections
    total.pause_s += g.pause_s
    total.longest_s = max(total.longest_s, g.longest_s)
    total.collected += g.collected
    total.steps += g.steps


def merge_saves(parts: Iterable[SaveStats]) -> SaveStats:
    """Checkpoint saves of several stretches (steps) added up."""
    total = SaveStats()
    for part in parts:
        total.saves += part.saves
        total.save_s += part.save_s
        total.steps_with_saves += part.steps_with_saves
        for call, n in part.calls.items():
            total.calls[call] = total.calls.get(call, 0) + n
    return total


def _gc(rank: RankProfile, steps: list[StepRecord], whole: bool) -> GcPauses | None:
    if whole and rank.gc_pauses is not None:
        return rank.gc_pauses
    if not any(s.gc_pauses is not None for s in rank.steps):
        return None  # not charged to steps (or not watched): unknown in a part of the window
    return merge_gc((s.gc_pauses for s in steps if s.gc_pauses is not None), rank.gc_pauses)


def _saves(rank: RankProfile, steps: list[StepRecord], whole: bool) -> SaveStats | None:
    if whole and rank.checkpoints is not None:
        return rank.checkpoints
    if not any(s.checkpoints is not None for s in rank.steps):
        return None
    return merge_saves(s.checkpoints for s in steps if s.checkpoints is not None)


def _activity(rank: RankProfile, span: tuple[float, float] | None, whole: bool) -> GpuActivity | None:
    act = rank.gpu_activity
    if act is None or whole:
        return act
    if span is None or not act.timed:
        return None
    lo, hi = span
    return dataclasses.replace(act, samples=[s for s in act.samples if lo <= s.t <= hi])


def slice_rank(rank: RankProfile, first: int, last: int) -> RankProfile | None:
    """The part of one rank's profile measured in steps ``first``..``last`` (None: no step of it there)."""
    steps = [s for s in rank.steps if first <= s.index <= last]
    if not steps:
        return None
    whole = len(steps) == len(rank.steps)
    span = step_span(rank, steps)
    if span is None:
        gpu, host = list(rank.gpu_samples), list(rank.host_samples)
        start = gpu[0].t if gpu else None
        end = gpu[-1].t if gpu else None
        if whole and rank.window_start_t is not None:
            start, end = rank.window_start_t, rank.window_end_t
    else:
        start, end = span
        gpu = [s for s in rank.gpu_samples if start <= s.t <= end]
        host = [s for s in rank.host_samples if start <= s.t <= end]
    return dataclasses.replace(
        rank,
        warmup_steps=steps[0].index - 1,
        steps=steps,
        gpu_samples=gpu,
        host_samples=host,
        window_start_t=start,
        window_end_t=end,
        memory=rank.memory if whole else MemoryStats(),
        trace=rank.trace if whole else None,
        checkpoints=_saves(rank, steps, whole),
        gc_pauses=_gc(rank, steps, whole),
        job_calls=rank.job_calls if whole else None,  # counted over the whole window, not per step
        stopped_by_probe=rank.stopped_by_probe and whole,
        probe_errors=list(rank.probe_errors),
        window_rule=rank.window_rule if whole else None,
        sync_sites=list(rank.sync_sites) if whole else [],
        collectives=[c for c in rank.collectives if first <= c.step <= last],
        gpu_activity=_activity(rank, span, whole),
    )


def slice_run(profile: RunProfile, first: int, last: int) -> RunProfile:
    """The run's profile in steps ``first``..``last``: each rank's slice (ranks without a step there are left
    out); the run's totals (a Trainer's whole runtime) only when the slice is the whole run."""
    ranks = [part for rank in profile.ranks if (part := slice_rank(rank, first, last)) is not None]
    whole = len(ranks) == len(profile.ranks) and all(
        len(part.steps) == len(rank.steps) for part, rank in zip(ranks, profile.ranks, strict=True)
    )
    return dataclasses.replace(profile, ranks=ranks, totals=profile.totals if whole else None)
