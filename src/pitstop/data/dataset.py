"""Datasets over a token cache: packed rows for training, single examples for length-grouped batches.

Both are plain map-style datasets (``__len__`` / ``__getitem__``), so they work with a torch DataLoader,
the Hugging Face Trainer and TRL's SFTTrainer alike. Items are numpy views into the memory-mapped cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pitstop.data.cache import TokenCache, open_cache
from pitstop.data.packing import Overflow, PackingPlan, plan_packing, shuffled_rows

IGNORE_INDEX = -100


def _labels(tokens: Any, mask: Any) -> Any:
    labels = np.asarray(tokens, dtype=np.int64).copy()
    labels[np.asarray(mask) == 0] = IGNORE_INDEX
    return labels


class PackedDataset:
    """Rows of whole examples packed best-fit-decreasing into at most ``max_len`` tokens.

    ``rows[i]`` is ``{"input_ids", "labels", "seq_lens"}``; labels are the tokens where the loss mask is 1
    (the response), -100 elsewhere. ``shuffle=True`` serves the rows in a seeded order that changes with
    ``set_epoch`` (the Trainer calls it), identical on every rank.
    """

    def __init__(
        self,
        cache: str | Path | TokenCache,
        max_len: int,
        overflow: Overflow = "truncate",
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        self.cache = cache if isinstance(cache, TokenCache) else open_cache(cache)
        self.max_len = max_len
        self.plan: PackingPlan = plan_packing(self.cache.lengths, max_len, overflow)
        self.shuffle = shuffle
        self.seed = seed
        self._order = list(range(len(self.plan.piece_rows)))
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        n = len(self.plan.piece_rows)
        self._order = shuffled_rows(n, self.seed, epoch) if self.shuffle else list(range(n))

    def __len__(self) -> int:
        return len(self.plan.piece_rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.plan.piece_rows[self._order[i]]
        ids, labels, lens = [], [], []
        for piece in row:
            example = int(self.plan.piece_example[piece])
            start = int(self.plan.piece_start[piece])
            length = int(self.plan.piece_length[piece])
            tokens, mask = self.cache.example(example)
            tokens, mask = tokens[start : start + length], mask[start : start + length]
            ids.append(np.asarray(tokens, dtype=np.int64))
            labels.append(_labels(tokens, mask))
            lens.append(length)
        return {"input_ids": np.concatenate(ids), "labels": np.concatenate(labels), "seq_lens": lens}


class CachedExamples:
    """One cached example per item (``input_ids``, ``labels``), truncated to ``max_len``, for padded batches."""

    def __init__(self, cache: str | Path | TokenCache, max_len: int | None = None) -> None:
        self.cache = cache if isinstance(cache, TokenCache) else open_cache(cache)
        self.max_len = max_len

    @property
    def lengths(self) -> list[int]:
        lengths = self.cache.lengths
        return (np.minimum(lengths, self.max_len) if self.max_len else lengths).tolist()

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, i: int) -> dict[str, Any]:
        tokens, mask = self.cache.example(i)
        if self.max_len:
            tokens, mask = tokens[: self.max_len], mask[: self.max_len]
        return {"input_ids": np.asarray(tokens, dtype=np.int64), "labels": _labels(tokens, mask)}
