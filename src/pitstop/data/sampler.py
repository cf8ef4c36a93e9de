"""Length-grouped batches, for models that cannot pack: similar lengths share a batch, so less padding.

Indices are shuffled with a seed, cut into mega-batches of ``batch_size × group`` examples, each sorted by
length and cut into batches; the batches are shuffled again. Randomness stays (every epoch differs), while
a batch's lengths sit close together.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np


class LengthGroupedBatchSampler:
    def __init__(
        self, lengths: Sequence[int], batch_size: int, group: int = 64, seed: int = 0, drop_last: bool = False
    ) -> None:
        if batch_size < 1 or group < 1:
            raise ValueError("batch_size and group must be at least 1")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.batch_size = batch_size
        self.group = group
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        order = rng.permutation(self.lengths.size)
        mega = self.batch_size * self.group
        batches: list[list[int]] = []
        for start in range(0, order.size, mega):
            chunk = order[start : start + mega]
            chunk = chunk[np.argsort(-self.lengths[chunk], kind="stable")]
            for b in range(0, chunk.size, self.batch_size):
                batch = chunk[b : b + self.batch_size].tolist()
                if len(batch) == self.batch_size or not self.drop_last:
                    batches.append(batch)
        return [batches[i] for i in rng.permutation(len(batches))]

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.batches()

    def __len__(self) -> int:
        full, rest = divmod(self.lengths.size, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)


def padding_share(lengths: Sequence[int], batches: list[list[int]], pad_to: int | None = None) -> float:
    """Pad tokens over all tokens when each batch pads to its longest (or to ``pad_to``)."""
    n = np.asarray(lengths, dtype=np.int64)
    real = padded = 0
    for batch in batches:
        if not batch:
            continue
        b = n[batch]
        width = pad_to if pad_to else int(b.max())
        real += int(np.minimum(b, width).sum())
        padded += width * len(batch)
    return 1.0 - real / padded if padded else 0.0
