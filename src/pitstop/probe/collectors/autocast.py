"""The dtype autocast ran in (the last enabled autocast region entered; kept across the whole run: a job
enters it once per step or once around the loop)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pitstop.core.profile import RankProfile
from pitstop.probe import environment as envmod
from pitstop.probe.collectors.base import Collector, collector


@dataclass
class AutocastSeen:
    device_type: str
    dtype: Any


@collector
class AutocastCollector(Collector):
    seen: AutocastSeen | None = None

    def on_autocast(self, device_type: str, dtype: Any, enabled: bool) -> None:
        if enabled:
            self.seen = AutocastSeen(device_type, dtype)

    def fill(self, draft: RankProfile) -> None:
        if self.seen is not None:
            draft.environment.autocast_dtype = envmod.dtype_name(self.seen.dtype)
