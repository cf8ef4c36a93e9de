"""Interval arithmetic and the sorted lookups the trace analyses rest on, against plain definitions."""

from __future__ import annotations

import numpy as np
import pytest

from pitstop.trace.intervals import intersection_length, length, sorted_unique, union


@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_sorted_unique_is_numpys_unique(dtype: type) -> None:
    rng = np.random.default_rng(0)
    for size in (0, 1, 2, 1000):
        values = rng.integers(-50, 50, size).astype(dtype)
        assert np.array_equal(sorted_unique(values), np.unique(values))


def test_union_length_and_overlap_by_brute_force() -> None:
    rng = np.random.default_rng(1)
    starts = rng.integers(0, 1000, 200).astype(np.float64)
    ends = starts + rng.integers(0, 30, 200)
    covered = np.zeros(1100, dtype=bool)  # unit cells [t, t + 1)
    for s, e in zip(starts.astype(int), ends.astype(int), strict=True):
        covered[s:e] = True
    merged = union(starts, ends)
    assert length(*merged) == covered.sum()
    other = union(np.array([100.0, 500.0]), np.array([300.0, 900.0]))
    expected = covered[100:300].sum() + covered[500:900].sum()
    assert intersection_length(merged, other) == expected


@pytest.mark.parametrize("in_order", [False, True])
def test_the_last_launch_of_each_id_is_numpys_unique_on_the_reversed_calls(in_order: bool) -> None:
    from pitstop.trace.temporal import _last_launch

    rng = np.random.default_rng(2)
    for size in (0, 1, 2, 5, 1000):
        ids = rng.integers(-1, 50, size)
        if in_order:
            ids = np.sort(ids)
        times = rng.random(size)
        keys, last = np.unique(ids[::-1], return_index=True)
        got_keys, got_times = _last_launch(ids, times)
        assert np.array_equal(got_keys, keys) and np.array_equal(got_times, times[::-1][last])
