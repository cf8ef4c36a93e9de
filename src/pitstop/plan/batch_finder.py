"""Finding the largest micro-batch that fits, on the real device, in as few trial steps as possible.

The search starts at the plan's prediction (``pitstop plan``), so it usually needs a handful of steps:
it gallops away from the prediction (±1, ±2, ±4, …) until it has one size that runs and one that does not,
then bisects between them. Each trial is one real training step of the caller's (give it the longest
sequences of the data); out-of-memory is recognized by exception type and message, and memory is released
between trials. The answer keeps a safety margin and the gradient accumulation that preserves the
effective batch.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from dataclasses import dataclass, field

OOM_MESSAGES = (
    "out of memory",
    "can't allocate memory",
    "not enough memory",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "hip out of memory",
)


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA / ROCm / CPU allocation failures, whatever exception type the backend raised them as."""
    if isinstance(exc, MemoryError):
        return True
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except ImportError:  # pragma: no cover - torch is there whenever a step can run
        pass
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OOM_MESSAGES)


def release_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover
        pass


@dataclass
class BatchSearch:
    largest: int  # the largest micro-batch that ran (0: not even 1)
    recommended: int  # with the safety margin taken off
    gradient_accumulation: int | None
    trials: list[tuple[int, bool]] = field(default_factory=list)  # (micro-batch, it ran)

    @property
    def trial_count(self) -> int:
        return len(self.trials)


def find_batch_size(
    step: Callable[[int], object],
    predicted: int,
    limit: int = 1 << 14,
    margin: float = 0.0,
    effective_batch: int | None = None,
    world_size: int = 1,
) -> BatchSearch:
    """Run ``step(micro_batch)`` for candidate sizes and return the largest that fits.

    ``margin`` (0–0.5) is taken off the largest size that ran, for what a single trial cannot show (longer
    rare sequences, fragmentation over time).
    """
    if predicted < 1 or limit < 1:
        raise ValueError("predicted and limit must be at least 1")
    trials: list[tuple[int, bool]] = []
    results: dict[int, bool] = {}

    def runs(size: int) -> bool:
        if size in results:
            return results[size]
        ok = True
        try:
            step(size)
        except BaseException as exc:
            if not is_out_of_memory(exc):
                raise
            ok = False
        finally:
            release_memory()
        results[size] = ok
        trials.append((size, ok))
        return ok

    start = min(predicted, limit)
    good, bad = (start, None) if runs(start) else (0, start)
    jump = 1
    if bad is None:  # gallop up from a size that runs
        while bad is None:
            nxt = min(good + jump, limit)
            if nxt == good:
                break  # reached the limit: everything up to it runs
            if runs(nxt):
                good = nxt
            else:
                bad = nxt
            jump *= 2
    else:  # gallop down from a size that does not
        while good == 0 and bad > 1:
            nxt = max(bad - jump, 1)
            if runs(nxt):
                good = nxt
            else:
                bad = nxt
            jump *= 2
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        if runs(mid):
            good = mid
        else:
            bad = mid
    recommended = max(1, math.floor(good * (1 - margin))) if good else 0
    accumulation = None
    if effective_batch and recommended:
        accumulation = max(1, math.ceil(effective_batch / (recommended * world_size)))
    return BatchSearch(
        largest=good, recommended=recommended, gradient_accumulation=accumulation, trials=trials
    )
