"""Where a trace's steps are, when it has no ``ProfilerStep#N`` spans.

Many real traces have none: a profiler used as a context manager without a schedule, ``record_function``
annotations only, another profiler's export. The steps are then read from what a training loop leaves every
step, in this order of trust:

1. ``Optimizer.step#…`` spans (the optimizer's hook): a step ends where the optimizer's update ends;
2. ``Optimizer.zero_grad#…`` spans: a step starts where the gradients are zeroed;
3. a ``record_function`` annotation repeated along the trace (``train_step``, ``## forward ##``, ``step_3``):
   a step starts where each occurrence starts;
4. the autograd engine's backward passes (its ``evaluate_function`` nodes, clustered by the gaps between
   them): a step ends where a backward pass ends;

and failing all, the whole trace is read as one window, so the breakdown, the utilization and the rules still
run on it. ``how`` says in words which of these it was; a report quotes it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from pitstop.trace.events import Columns, TraceColumns

MIN_PASS_GAP = 20.0  # a gap between backward passes is at least this many times the median gap inside one


@dataclass
class Window:
    start: float
    end: float


def _spans(c: Columns) -> tuple[np.ndarray, np.ndarray]:
    ts, end = np.frombuffer(c.ts, dtype=np.float64), np.frombuffer(c.end, dtype=np.float64)
    order = np.argsort(ts, kind="stable")
    return ts[order], end[order]


def trace_extent(cols: TraceColumns) -> tuple[float, float] | None:
    """First start and last end of anything timed on the host or the GPU."""
    lo, hi = np.inf, -np.inf
    for c in (
        cols.runtime,
        cols.kernels,
        cols.memcpy,
        cols.memset,
        cols.cpu_ops,
        cols.annotations,
        cols.dataloader,
    ):
        if len(c):
            lo = min(lo, float(np.min(np.frombuffer(c.ts, dtype=np.float64))))
            hi = max(hi, float(np.max(np.frombuffer(c.end, dtype=np.float64))))
    return (lo, hi) if hi > lo else None


def _host_start(cols: TraceColumns) -> float | None:
    """Where the host's recorded activity starts (the first step's start when only its end is marked)."""
    starts = [
        float(np.min(np.frombuffer(c.ts, dtype=np.float64)))
        for c in (cols.runtime, cols.cpu_ops, cols.annotations, cols.dataloader)
        if len(c)
    ]
    return min(starts) if starts else None


def _between_ends(ends: np.ndarray, first_start: float | None) -> list[Window]:
    """Steps that end at each boundary: from one end to the next; the first from the host's first activity when
    that is no longer than a typical step (else it holds the setup, not a step)."""
    windows = [Window(float(a), float(b)) for a, b in itertools.pairwise(ends) if b > a]
    if first_start is not None and ends.size and ends[0] > first_start:
        typical = float(np.median([w.end - w.start for w in windows])) if windows else np.inf
        if ends[0] - first_start <= 1.5 * typical:
            windows.insert(0, Window(first_start, float(ends[0])))
    return windows


def _between_starts(starts: np.ndarray, ends: np.ndarray) -> list[Window]:
    """Steps that start at each boundary; the last occurrence is a step of its own when the marks cover whole
    steps (their spans as long as the periods between them)."""
    windows = [Window(float(a), float(b)) for a, b in itertools.pairwise(starts) if b > a]
    if windows:
        period = float(np.median(np.diff(starts)))
        cover = float(np.median(ends[:-1] - starts[:-1]))
        if period > 0 and cover >= 0.8 * period and ends[-1] > starts[-1]:
            windows.append(Window(float(starts[-1]), float(ends[-1])))
    return windows


def _repeated_annotation(cols: TraceColumns) -> tuple[str, list[Window]] | None:
    """The annotation that best marks a step: repeated, never overlapping itself, covering the most time."""
    best: tuple[float, str, np.ndarray, np.ndarray] | None = None
    for key, spans in cols.annotated.items():
        if len(spans) < 2:
            continue
        ts, end = _spans(spans)
        if np.any(ts[1:] < end[:-1]):  # nested in itself (recursion) or on several threads: not a step
            continue
        covered = float(np.sum(end - ts))
        if best is None or covered > best[0]:
            best = (covered, key, ts, end)
    if best is None:
        return None
    windows = _between_starts(best[2], best[3])
    return (best[1], windows) if windows else None


def _backward_passes(cols: TraceColumns) -> np.ndarray:
    """The end of each backward pass: the autograd engine's nodes, split where the gap between two of them is
    far longer than the gaps inside a pass."""
    ts, end = _spans(cols.backward)
    if ts.size < 2:
        return end[-1:] if end.size else end
    gaps = ts[1:] - np.maximum.accumulate(end)[:-1]
    inner = float(np.median(np.maximum(gaps, 0.0)))
    split = gaps > max(MIN_PASS_GAP * inner, 1.0)
    if not split.any():
        return np.array([float(end.max())])
    cut = np.flatnonzero(split)
    running = np.maximum.accumulate(end)
    return np.append(running[cut], running[-1])


def infer_windows(cols: TraceColumns) -> tuple[list[Window], str]:
    """The steps of a trace without ProfilerStep#N spans, and how they were found (see the module docstring)."""
    first = _host_start(cols)
    if len(cols.optimizer_steps):
        _, ends = _spans(cols.optimizer_steps)
        windows = _between_ends(ends, first)
        if windows:
            return windows, (
                f"no ProfilerStep#N: steps read from the {ends.size} Optimizer.step spans (a step ends with one)"
            )
    if len(cols.zero_grads) >= 2:
        starts, ends = _spans(cols.zero_grads)
        windows = [Window(float(a), float(b)) for a, b in itertools.pairwise(starts) if b > a]
        if windows:
            return windows, (
                f"no ProfilerStep#N: steps read from the {starts.size} Optimizer.zero_grad spans "
                "(a step starts with it)"
            )
    found = _repeated_annotation(cols)
    if found is not None:
        key, windows = found
        return windows, f"no ProfilerStep#N: steps read from the repeated annotation '{key}'"
    if len(cols.backward):
        ends = _backward_passes(cols)
        windows = _between_ends(ends, first)
        if windows:
            return (
                windows,
                f"no ProfilerStep#N: steps read from the {ends.size} backward passes (a step ends with one)",
            )
    extent = trace_extent(cols)
    if extent is None:
        return [], "no ProfilerStep#N and nothing timed in the trace"
    lo, hi = extent
    return [Window(lo, hi)], f"no step markers: the whole {_seconds(hi - lo)} trace read as one window"


def _seconds(us: float) -> str:
    s = us / 1e6
    return f"{s:.1f} s" if s >= 1 else f"{s * 1000:.1f} ms" if s >= 1e-3 else f"{us:.0f} µs"
