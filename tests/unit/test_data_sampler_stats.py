"""Length-grouped batches and padding statistics."""

from __future__ import annotations

import numpy as np
import pytest

from pitstop.data.sampler import LengthGroupedBatchSampler, padding_share
from pitstop.data.stats import length_stats


def test_grouped_batches_cover_everything_once_and_pad_less() -> None:
    lengths = np.random.default_rng(1).integers(10, 1000, 5000).tolist()
    sampler = LengthGroupedBatchSampler(lengths, batch_size=8, seed=2)
    batches = sampler.batches()
    assert sorted(i for b in batches for i in b) == list(range(5000)) and len(sampler) == len(batches)
    rng = np.random.default_rng(0)
    order = rng.permutation(5000)
    random_batches = [order[i : i + 8].tolist() for i in range(0, 5000, 8)]
    assert padding_share(lengths, batches) < padding_share(lengths, random_batches) / 5
    sampler.set_epoch(1)
    assert sampler.batches() != batches  # a new order each epoch


def test_padding_share_by_hand() -> None:
    assert padding_share([2, 4, 4, 8], [[0, 1], [2, 3]]) == pytest.approx(1 - 18 / 24)
    assert padding_share([2, 4], [[0, 1]], pad_to=10) == pytest.approx(1 - 6 / 20)


def test_length_stats() -> None:
    lengths = [100] * 50 + [900] * 50
    s = length_stats(lengths, batch_size=10, max_len=1024, padding="max_length")
    assert s.padding_now == pytest.approx(1 - 50_000 / (100 * 1024))
    assert s.padding_grouped < 0.02 and s.speedup_packed > 1.8
    assert (s.min, s.median, s.max, s.over_max_len) == (100, 500.0, 900, 0)
