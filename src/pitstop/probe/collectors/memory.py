"""GPU memory: the peaks and the allocator's retries and OOMs (read once, at the end), and the CUDA caching
allocator across the window: ``torch.cuda.memory_stats()`` read at each step's end.

In a steady training loop the allocator serves every tensor from its cache: no cudaMalloc, no cudaFree, no
retry. Counters that keep growing step after step mean it thrashes (each cudaFree synchronises the device; a
retry frees the whole cache first). ``summarise`` is pure, so recorded ``memory_stats`` dicts test it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from pitstop.core.profile import Environment, MemoryStats, RankProfile, StepRecord
from pitstop.core.vocabulary import Device
from pitstop.probe.collectors.base import Collector, ProbeContext, collector

KEYS = (
    "num_alloc_retries",
    "num_device_alloc",
    "num_device_free",
    "reserved_bytes.all.current",
    "allocated_bytes.all.current",
    "inactive_split_bytes.all.current",
)


def _get(stats: Mapping[str, Any], key: str) -> int | None:
    value = stats.get(key)
    return int(value) if isinstance(value, int | float) else None


def summarise(snapshots: Sequence[Mapping[str, Any]], into: MemoryStats) -> None:
    """Fill the window fields of ``into`` from one snapshot per step end (the first is the window's start)."""
    if len(snapshots) < 2:
        return
    first, last = snapshots[0], snapshots[-1]

    def delta(key: str) -> int | None:
        a, b = _get(first, key), _get(last, key)
        return None if a is None or b is None else max(0, b - a)

    def mean(key: str) -> float | None:
        values = [v for v in (_get(s, key) for s in snapshots[1:]) if v is not None]
        return sum(values) / len(values) if values else None

    allocs = [_get(s, "num_device_alloc") for s in snapshots]
    into.window_steps = len(snapshots) - 1
    into.window_alloc_retries = delta("num_alloc_retries")
    into.window_device_allocs = delta("num_device_alloc")
    into.window_device_frees = delta("num_device_free")
    into.steps_with_device_allocs = sum(
        1 for a, b in itertools.pairwise(allocs) if a is not None and b is not None and b > a
    )
    into.reserved_mean = mean("reserved_bytes.all.current")
    into.allocated_mean = mean("allocated_bytes.all.current")
    into.inactive_split_mean = mean("inactive_split_bytes.all.current")


class AllocatorWatch:
    """Keeps the counters of ``KEYS`` at every step end of the window (a dict lookup per key: microseconds)."""

    def __init__(self) -> None:
        import torch

        self._stats = torch.cuda.memory_stats
        self.snapshots: list[dict[str, Any]] = []
        self.step()  # the window's start

    def step(self) -> None:
        stats = self._stats()
        self.snapshots.append({k: stats.get(k) for k in KEYS})

    def fill(self, memory: MemoryStats) -> None:
        summarise(self.snapshots, memory)


@collector
class MemoryCollector(Collector):
    """The window's counters are ``AllocatorWatch``'s snapshots; None off a GPU and until the window starts."""

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.watch: AllocatorWatch | None = None
        self._counting = False

    def start_window(self) -> None:
        if self.ctx.on_cuda:
            self.watch = AllocatorWatch()  # its first snapshot: the window's start
            self._counting = True

    def step_end(self, record: StepRecord) -> None:
        if self._counting and self.watch is not None:
            self.watch.step()

    def stop_window(self) -> None:
        self._counting = False

    def fill(self, draft: RankProfile) -> None:
        draft.memory = memory_stats(draft.environment, self.ctx.device)
        if self.watch is not None:
            self.watch.fill(draft.memory)


def memory_stats(env: Environment, device: Any) -> MemoryStats:
    """Peaks, retries and OOMs of ``device`` since the process started (empty off a GPU or on a failure)."""
    if env.device != Device.CUDA:
        return MemoryStats()
    try:
        import torch

        stats = torch.cuda.memory_stats(device)
        return MemoryStats(
            peak_allocated=int(torch.cuda.max_memory_allocated(device)),
            peak_reserved=int(torch.cuda.max_memory_reserved(device)),
            alloc_retries=int(stats.get("num_alloc_retries", 0)),
            ooms=int(stats.get("num_ooms", 0)),
        )
    except Exception:
        return MemoryStats()
