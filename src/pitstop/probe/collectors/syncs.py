"""Where the host waited on the GPU in the window (call sites, counts, seconds) and how batches were copied to
it (blocking or not, from pinned memory or not). The calls are wrapped by ``Hooks.install_sync_watch``, on a
GPU only; each step's sync time itself belongs to the step's record (the probe's timeline)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pitstop.core.profile import RankProfile, SyncSite
from pitstop.probe.collectors.base import WindowCounts, collector

MAX_SYNC_SITES = 20


@dataclass
class HostWaits:
    sites: dict[tuple[str, str], SyncSite] = field(default_factory=dict)  # (site, kind) -> its totals
    copies: int = 0  # host-to-device copies
    pinned_blocking: int = 0  # from pinned memory, yet blocking
    non_blocking: int = 0


@collector
class SyncCollector(WindowCounts[HostWaits]):
    counts_type = HostWaits

    def begin(self) -> None:
        if self.ctx.on_cuda:
            self.ctx.hooks.install_sync_watch()

    def on_sync(self, seconds: float | None, kind: str, site: str) -> None:
        sites = self.counts.sites
        found = sites.get((site, kind))
        if found is None:
            found = sites[(site, kind)] = SyncSite(site=site, kind=kind, seconds=0.0)
        found.count += 1
        if seconds is None:
            found.seconds = None
        elif found.seconds is not None:
            found.seconds += seconds

    def on_copy(self, pinned: bool, non_blocking: bool) -> None:
        counts = self.counts
        counts.copies += 1
        counts.pinned_blocking += pinned and not non_blocking
        counts.non_blocking += non_blocking

    def fill(self, draft: RankProfile) -> None:
        counts = self.counts
        if self.ctx.hooks.sync_watched:
            loader = draft.environment.dataloader
            loader.h2d_copies = counts.copies
            loader.h2d_copies_pinned_blocking = counts.pinned_blocking
            loader.h2d_copies_non_blocking = counts.non_blocking
        sites = sorted(counts.sites.values(), key=lambda x: (-(x.seconds or 0.0), -x.count))
        draft.sync_sites = [replace(x) for x in sites[:MAX_SYNC_SITES]]
