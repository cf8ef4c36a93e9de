"""Checkpoint saves in the window: how many, their time, the steps they stalled, by call (``probe.saves``
wraps the save functions at the window's start, once the job has imported its framework)."""

from __future__ import annotations

from pitstop.probe.collectors.base import Collector, ProbeContext, collector
from pitstop.probe.saves import install_save_watch
from pitstop.profile import RankProfile, SaveStats, StepRecord


@collector
class SaveCollector(Collector):
    """The counters are ``SaveStats`` (the profile's own dataclass); None until the window starts."""

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.stats: SaveStats | None = None
        self._open: list[tuple[str, float]] = []  # saves in the step not closed yet
        self._counting = False

    def start_window(self) -> None:
        self.stats = SaveStats()
        self._counting = True
        install_save_watch(self.ctx.hooks, self.on_save)

    def on_save(self, label: str, seconds: float) -> None:
        """Held until the step the save ran in closes: a save after the last step (the final save at the end
        of training) stalls no measured step and is not counted."""
        if self._counting:
            self._open.append((label, seconds))

    def step_end(self, record: StepRecord) -> None:
        saves, self._open = self._open, []
        stats = self.stats
        if stats is None or not saves:
            return
        stats.steps_with_saves += 1
        step = SaveStats(steps_with_saves=1)  # the step's own share: a window of steps has its saves
        for label, seconds in saves:
            for counts in (stats, step):
                counts.saves += 1
                counts.save_s += seconds
                counts.calls[label] = counts.calls.get(label, 0) + 1
        record.checkpoints = step

    def stop_window(self) -> None:
        self._counting = False

    def fill(self, draft: RankProfile) -> None:
        draft.checkpoints = self.stats
