"""How much of a dataset's compute would be padding: today's batching vs length grouping vs packing."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from pitstop.data.packing import plan_packing
from pitstop.data.sampler import LengthGroupedBatchSampler, padding_share


@dataclass
class LengthStats:
    examples: int
    tokens: int
    min: int
    median: float
    p90: float
    max: int
    over_max_len: int
    batch_size: int
    max_len: int
    padding: str  # "longest" or "max_length"
    padding_now: float  # pad share with random batches of batch_size, padded as today
    padding_grouped: float  # with length-grouped batches (padded to the longest)
    padding_packed: float  # with best-fit-decreasing packing into max_len rows
    speedup_grouped: float
    speedup_packed: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def length_stats(
    lengths: list[int], batch_size: int, max_len: int, padding: str = "longest", seed: int = 0
) -> LengthStats:
    n = np.minimum(np.asarray(lengths, dtype=np.int64), max_len)
    if n.size == 0:
        raise ValueError("no examples")
    rng = np.random.default_rng(seed)
    order = rng.permutation(n.size)
    random_batches = [order[i : i + batch_size].tolist() for i in range(0, n.size, batch_size)]
    pad_to = max_len if padding == "max_length" else None
    now = padding_share(n.tolist(), random_batches, pad_to)
    grouped = padding_share(
        n.tolist(), LengthGroupedBatchSampler(n.tolist(), batch_size, seed=seed).batches()
    )
    plan = plan_packing(n, max_len)
    packed = 1.0 - plan.efficiency
    raw = np.asarray(lengths, dtype=np.int64)
    return LengthStats(
        examples=int(n.size),
        tokens=int(n.sum()),
        min=int(raw.min()),
        median=float(np.median(raw)),
        p90=float(np.percentile(raw, 90)),
        max=int(raw.max()),
        over_max_len=int((raw > max_len).sum()),
        batch_size=batch_size,
        max_len=max_len,
        padding=padding,
        padding_now=now,
        padding_grouped=grouped,
        padding_packed=packed,
        # compute scales with the tokens processed: real tokens / (1 - pad share); attention gains more
        speedup_grouped=(1 - grouped) / (1 - now) if now < 1 else 1.0,
        speedup_packed=(1 - packed) / (1 - now) if now < 1 else 1.0,
    )
