"""A single-process DataLoader's collate: its time per batch in the window, and whether its examples are raw
text (tokenized in the loop)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pitstop.core.profile import RankProfile
from pitstop.data.rawtext import looks_like_text
from pitstop.probe.collectors.base import ProbeContext, WindowCounts, collector


@dataclass
class CollateTime:
    batches: int = 0
    seconds: float = 0.0


@collector
class CollateCollector(WindowCounts[CollateTime]):
    counts_type = CollateTime

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.examples_are_text: bool | None = None  # decided once, from the first batch's examples

    def on_collate(self, samples: Any, seconds: float) -> None:
        counts = self.counts
        counts.batches += 1
        counts.seconds += seconds
        if self.examples_are_text is None:
            self.examples_are_text = looks_like_text(samples)

    def fill(self, draft: RankProfile) -> None:
        loader = draft.environment.dataloader
        batches, seconds = self.counts.batches, self.counts.seconds
        loader.examples_are_text = self.examples_are_text
        loader.collate_s_per_batch = seconds / batches if batches else None
