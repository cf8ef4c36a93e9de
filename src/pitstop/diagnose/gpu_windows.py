"""When each GPU computed, and how busy it was then: the GPU-sample windows every rule and report reads.

A GPU-utilization mean over a whole log mixes two things: how full the GPU is while the job computes
(a small batch leaves it half idle) and how long the job does not compute at all (loading before the
first step, evaluation or checkpoint pauses, a GPU the job never used). Each has its own cause, so they
are told apart here, once, per GPU:

- the samples inside the measured window (a live probe's steps; the whole log where no window is known);
- idle stretches: runs of samples at or under ``IDLE_UTIL`` lasting at least ``MIN_PAUSE_S``; in a log
  the idle head and tail are stretches of any length (the job had not started or had finished). Shorter
  dips between busy samples stay inside the active time: they are waits between steps, the input
  pipeline's business, not pauses of the job;
- the active time (the window less its stretches) and the mean utilization over it;
- whether the GPU never worked at all (peak at or under ``NEVER_BUSY_UTIL``): such a GPU belongs to
  ``idle_gpu``, never to an average.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field
from itertools import pairwise

from pitstop.core.profile import GpuSample, RankProfile, RunProfile

IDLE_UTIL = 5.0  # % at or under which a sample counts as the GPU doing nothing
NEVER_BUSY_UTIL = 2.0  # % that a GPU's peak never exceeds when the job never used it
MIN_PAUSE_S = 10.0  # idle runs shorter than this are dips between steps, not pauses of the job
MIN_PAUSE_SAMPLES = 3
PERIODIC_CV = 0.25  # pauses whose spacing varies less than this (std / mean) are periodic
MIN_PERIODIC = 3


@dataclass
class IdleStretch:
    """A stretch of the window in which the GPU did nothing. Seconds from the window's first sample."""

    start_s: float
    duration_s: float
    kind: str  # "lead_in" (before the job first computed), "pause" (between busy stretches), "tail"
    first: int = 0  # slice of the rank's gpu_samples it covers
    last: int = 0


@dataclass
class GpuWindow:
    """One GPU's samples inside the measured window and when the job computed on it.

    Utilizations are fractions (0..1). ``first``/``last`` slice the rank's ``gpu_samples`` (samples are in
    time order), so a picture of the window reads the samples without filtering them again."""

    gpu: int  # the rank (a GPU of an nvidia-smi log is a rank of its own)
    first: int
    last: int  # exclusive
    interval_s: float | None  # median spacing of the samples
    span_s: float  # samples × interval
    mean_util: float | None  # over every sample in the window (the whole-log figure)
    min_util: float | None
    max_util: float | None
    never_busy: bool
    active_s: float
    active_util: float | None  # over the active time only: how full the GPU is while the job computes
    stretches: list[IdleStretch] = field(default_factory=list)
    pause_period_s: float | None = None  # mean spacing of periodic pauses; None when not periodic

    @property
    def samples(self) -> int:
        return self.last - self.first

    @property
    def active_frac(self) -> float | None:
        return self.active_s / self.span_s if self.span_s > 0 else None

    @property
    def pauses(self) -> list[IdleStretch]:
        return [s for s in self.stretches if s.kind == "pause"]

    @property
    def lead_in_s(self) -> float:
        return sum(s.duration_s for s in self.stretches if s.kind == "lead_in")

    @property
    def tail_s(self) -> float:
        return sum(s.duration_s for s in self.stretches if s.kind == "tail")


def window_slice(rank: RankProfile) -> tuple[int, int]:
    """Index range of the rank's GPU samples inside its measured window (all of them when unknown)."""
    samples = rank.gpu_samples
    if rank.window_start_t is None or rank.window_end_t is None:
        return 0, len(samples)
    times = [s.t for s in samples]
    if any(b < a for a, b in pairwise(times)):  # out of order: fall back to a scan
        inside = [i for i, t in enumerate(times) if rank.window_start_t <= t <= rank.window_end_t]
        return (inside[0], inside[-1] + 1) if inside else (0, 0)
    return bisect.bisect_left(times, rank.window_start_t), bisect.bisect_right(times, rank.window_end_t)


def active_samples(rank: RankProfile, window: GpuWindow) -> list[GpuSample]:
    """The rank's samples inside the window's active time (its idle stretches left out)."""
    out, at = [], window.first
    for stretch in sorted(window.stretches, key=lambda s: s.first):
        out += rank.gpu_samples[at : stretch.first]
        at = stretch.last
    return out + rank.gpu_samples[at : window.last]


def window_samples(rank: RankProfile) -> list[GpuSample]:
    lo, hi = window_slice(rank)
    return rank.gpu_samples[lo:hi]


def _interval(samples: list[GpuSample]) -> float | None:
    gaps = [b.t - a.t for a, b in pairwise(samples) if b.t > a.t]
    return statistics.median(gaps) if gaps else None


def _idle_runs(utils: list[float | None]) -> list[tuple[int, int]]:
    """(start, end) index ranges of consecutive idle samples (unknown readings break no run)."""
    runs: list[tuple[int, int]] = []
    start: int | None = None
    for i, u in enumerate(utils):
        idle = u is not None and u <= IDLE_UTIL
        if idle and start is None:
            start = i
        elif not idle and u is not None and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(utils)))
    return runs


def _stretches(
    samples: list[GpuSample], utils: list[float | None], dt: float, trim_ends: bool
) -> list[tuple[int, int, str]]:
    min_samples = max(MIN_PAUSE_SAMPLES, round(MIN_PAUSE_S / dt) if dt > 0 else MIN_PAUSE_SAMPLES)
    out = []
    for a, b in _idle_runs(utils):
        if trim_ends and a == 0:
            out.append((a, b, "lead_in"))
        elif trim_ends and b == len(utils):
            out.append((a, b, "tail"))
        elif b - a >= min_samples:
            out.append((a, b, "pause"))
    return out


def _period(pauses: list[IdleStretch]) -> float | None:
    if len(pauses) < MIN_PERIODIC:
        return None
    spacing = [b.start_s - a.start_s for a, b in pairwise(pauses)]
    mean = statistics.fmean(spacing)
    if mean <= 0 or (len(spacing) > 1 and statistics.pstdev(spacing) / mean > PERIODIC_CV):
        return None
    return mean


def gpu_window(rank: RankProfile) -> GpuWindow | None:
    """The window of one rank's GPU samples, or None when it has no utilization readings."""
    lo, hi = window_slice(rank)
    samples = rank.gpu_samples[lo:hi]
    utils = [s.util for s in samples]
    known = [u for u in utils if u is not None]
    if not known:
        return None
    dt = _interval(samples) or 1.0
    span = len(samples) * dt
    trim_ends = rank.window_start_t is None  # a log: the idle head and tail are outside the job's steps
    never_busy = max(known) <= NEVER_BUSY_UTIL
    runs = [] if never_busy else _stretches(samples, utils, dt, trim_ends)
    t0 = samples[0].t
    stretches = [IdleStretch(samples[a].t - t0, (b - a) * dt, kind, lo + a, lo + b) for a, b, kind in runs]
    excluded = {i for a, b, _ in runs for i in range(a, b)}
    active = [u for i, u in enumerate(utils) if u is not None and i not in excluded]
    active_s = 0.0 if never_busy else span - sum(s.duration_s for s in stretches)
    return GpuWindow(
        gpu=rank.rank,
        first=lo,
        last=hi,
        interval_s=_interval(samples),
        span_s=span,
        mean_util=statistics.fmean(known) / 100.0,
        min_util=min(known) / 100.0,
        max_util=max(known) / 100.0,
        never_busy=never_busy,
        active_s=max(active_s, 0.0),
        active_util=statistics.fmean(active) / 100.0 if active and not never_busy else None,
        stretches=stretches,
        pause_period_s=_period([s for s in stretches if s.kind == "pause"]),
    )


def gpu_windows(profile: RunProfile) -> list[GpuWindow]:
    """One window per rank that logged GPU utilization, in rank order."""
    out = [w for r in profile.ranks if (w := gpu_window(r)) is not None]
    return sorted(out, key=lambda w: w.gpu)


def working(windows: list[GpuWindow]) -> list[GpuWindow]:
    """The GPUs the job used (those that never worked are idle_gpu's, not part of any average)."""
    return [w for w in windows if not w.never_busy]


def active_util(windows: list[GpuWindow]) -> float | None:
    """Mean over the GPUs that worked of their utilization while the job computed."""
    values = [w.active_util for w in working(windows) if w.active_util is not None]
    return statistics.fmean(values) if values else None


def active_frac(windows: list[GpuWindow]) -> float | None:
    """Mean over the GPUs that worked of the share of their window in which the job computed."""
    values = [f for w in working(windows) if (f := w.active_frac) is not None]
    return statistics.fmean(values) if values else None


def describe_stretches(w: GpuWindow) -> list[str]:
    """What the idle stretches of one GPU look like, in words (for the notes and the reports)."""
    lines = []
    pauses = w.pauses
    if w.lead_in_s >= 60:
        lines.append(
            f"GPU {w.gpu} did nothing for the first {_dur(w.lead_in_s)} of the log (loading the model and the "
            "data?); that time is left out of its utilization"
        )
    if pauses:
        total = sum(p.duration_s for p in pauses)
        what = (
            f", one every {_dur(w.pause_period_s)}: periodic, as evaluation or checkpointing is"
            if w.pause_period_s
            else ""
        )
        lines.append(
            f"GPU {w.gpu} paused {len(pauses)} times, {_dur(total)} in all "
            f"(~{_dur(total / len(pauses))} each{what}); pauses are left out of its utilization"
        )
    return lines


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 90:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"
