"""Interval arithmetic on sorted numpy arrays: unions, lengths, coverage of points, clipping to windows."""

from __future__ import annotations

from typing import Any

import numpy as np

Array = Any  # numpy.ndarray of float64


def sorted_unique(values: Array) -> Array:
    """``np.unique(values)``: numpy 2.3+ finds unique values with a hash table and then sorts them, ~20x
    slower than one sort on a trace's 200,000 correlation ids (0.4 s against 0.02 s)."""
    ordered = np.sort(np.asarray(values), kind="stable")
    if ordered.size < 2:
        return ordered
    keep = np.empty(ordered.size, dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def union(starts: Array, ends: Array) -> tuple[Array, Array]:
    """Merged, sorted, disjoint intervals; touching intervals merge (next.start <= current end).

    A merged interval ends at the running maximum of the ends at its last member. Input already in start
    order (most of a trace's columns) is not sorted again: a 2 GB trace has millions of runtime calls, and
    this is the analyses' largest temporary.
    """
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    n = starts.size
    if n == 0:
        return starts, ends
    if n > 1 and not bool(np.all(starts[1:] >= starts[:-1])):
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        del order
    reach = np.maximum.accumulate(ends)
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.greater(starts[1:], reach[:-1], out=new[1:])
    lasts = np.flatnonzero(new)  # the first member of each merged interval, turned in place into its last
    del new
    merged_s = starts[lasts]
    lasts[:-1] = lasts[1:] - 1
    lasts[-1] = n - 1
    merged_e = reach[lasts]
    del reach, lasts  # each temporary goes as soon as it is used: a runtime union is the analyses' peak
    np.maximum(merged_e, merged_s, out=merged_e)
    return merged_s, merged_e


def length(starts: Array, ends: Array) -> float:
    return float(np.sum(ends - starts)) if starts.size else 0.0


def covers(starts: Array, ends: Array, points: Array) -> Array:
    """Which points lie strictly inside the (disjoint, sorted) intervals."""
    if starts.size == 0:
        return np.zeros(points.size, dtype=bool)
    idx = np.searchsorted(starts, points, side="right") - 1
    inside = idx >= 0
    safe = np.where(inside, idx, 0)
    return inside & (points < ends[safe]) & (points > starts[safe])


def intersection_length(a: tuple[Array, Array], b: tuple[Array, Array]) -> float:
    """Length of the overlap of two disjoint interval sets."""
    (a_s, a_e), (b_s, b_e) = a, b
    if a_s.size == 0 or b_s.size == 0:
        return 0.0
    points = sorted_unique(np.concatenate([a_s, a_e, b_s, b_e]))
    mids = (points[:-1] + points[1:]) / 2
    both = covers(a_s, a_e, mids) & covers(b_s, b_e, mids)
    return float(np.sum(np.diff(points)[both]))
