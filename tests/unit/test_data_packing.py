"""Packing plans: best-fit decreasing over the whole dataset, overflow handling, seeded row order."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pitstop.data import plan_packing
from pitstop.data.packing import shuffled_rows


def _reference_bfd(lengths: list[int], max_len: int) -> int:
    """Example-by-example best fit decreasing, the textbook way (slow, for small inputs)."""
    rooms: list[int] = []
    for n in sorted((min(n, max_len) for n in lengths if n > 0), reverse=True):
        fits = [i for i, r in enumerate(rooms) if r >= n]
        if fits:
            best = min(fits, key=lambda i: rooms[i])
            rooms[best] -= n
        else:
            rooms.append(max_len - n)
    return len(rooms)


def test_bulk_plan_matches_textbook_best_fit_decreasing() -> None:
    rng = random.Random(0)
    for _ in range(300):
        max_len = rng.choice([8, 16, 50, 128])
        lengths = [rng.randint(0, max_len + 5) for _ in range(rng.randint(0, 80))]
        plan = plan_packing(lengths, max_len)
        assert len(plan.bins) == _reference_bfd(lengths, max_len)
        assert sorted(i for row in plan.bins for i in row) == [i for i, n in enumerate(lengths) if n > 0]
        assert all(sum(n for _, _, n in row) <= max_len for row in plan.rows)
        assert len(plan.bins) >= plan.lower_bound


def test_overflow_choices_are_counted() -> None:
    lengths = [5, 30, 12, 0, 64]
    truncate = plan_packing(lengths, 16)
    assert truncate.too_long == [1, 4] and truncate.dropped_tokens == (30 - 16) + (64 - 16)
    assert truncate.total_tokens == 5 + 16 + 12 + 16
    drop = plan_packing(lengths, 16, overflow="drop")
    assert sorted(i for row in drop.bins for i in row) == [0, 2] and drop.dropped_tokens == 94
    split = plan_packing(lengths, 16, overflow="split")
    assert split.total_tokens == sum(lengths) and split.dropped_tokens == 0
    pieces = sorted((ex, start, n) for row in split.rows for ex, start, n in row if ex == 4)
    assert pieces == [(4, 0, 16), (4, 16, 16), (4, 32, 16), (4, 48, 16)]
    with pytest.raises(ValueError):
        plan_packing(lengths, 16, overflow="wrap")  # type: ignore[arg-type]


def test_million_lengths_plan_tight() -> None:
    lengths = np.random.default_rng(0).lognormal(5.5, 0.8, 1_000_000).astype(int).clip(1, 8000)
    plan = plan_packing(lengths, 2048)
    assert len(plan.piece_rows) <= plan.lower_bound * 1.001
    assert plan.efficiency > 0.999
    assert len(plan.too_long) == int((lengths > 2048).sum())


def test_seeded_row_order_changes_per_epoch_and_repeats() -> None:
    a, b = shuffled_rows(100, seed=3, epoch=0), shuffled_rows(100, seed=3, epoch=1)
    assert sorted(a) == list(range(100)) and a != b
    assert shuffled_rows(100, seed=3, epoch=0) == a
