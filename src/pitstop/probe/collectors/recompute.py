"""Activation checkpointing seen at work: ``torch.utils.checkpoint.checkpoint`` calls in the window, for a job
whose configuration did not say (a hand-written model)."""

from __future__ import annotations

from dataclasses import dataclass

from pitstop.core.profile import RankProfile
from pitstop.probe.collectors.base import WindowCounts, collector


@dataclass
class CheckpointCalls:
    calls: int = 0


@collector
class RecomputeCollector(WindowCounts[CheckpointCalls]):
    counts_type = CheckpointCalls

    def on_checkpoint(self) -> None:
        self.counts.calls += 1

    def fill(self, draft: RankProfile) -> None:
        env = draft.environment
        if env.gradient_checkpointing is None and self.counts.calls:
            env.gradient_checkpointing = True
