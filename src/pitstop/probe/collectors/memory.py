"""GPU memory: the peaks and the allocator's retries and OOMs (read once, at the end), and the caching
allocator across the window (``probe.allocator``: ``torch.cuda.memory_stats`` kept at each step end)."""

from __future__ import annotations

from typing import Any

from pitstop.probe.allocator import AllocatorWatch
from pitstop.probe.collectors.base import Collector, ProbeContext, collector
from pitstop.profile import Environment, MemoryStats, RankProfile, StepRecord
from pitstop.vocabulary import Device


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
