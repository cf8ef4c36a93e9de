"""The probe's collectors: one measured signal each (see ``base``), listed in the order they fill a profile.

Adding a signal: a module here with a ``Collector`` subclass and its counters' dataclass, and one entry in
``COLLECTORS``. The probe calls every entry at the window's start and end and asks each to fill the profile;
it needs no change unless the signal listens at a hook the probe already routes (see
``docs/architecture.md``, "The probe").
"""

from __future__ import annotations

from pitstop.probe.collectors.attention import AttentionCollector
from pitstop.probe.collectors.attention_timing import AttentionTimingCollector
from pitstop.probe.collectors.autocast import AutocastCollector
from pitstop.probe.collectors.base import Collector, ProbeContext, overrides
from pitstop.probe.collectors.collate import CollateCollector
from pitstop.probe.collectors.collectives import CollectivesCollector
from pitstop.probe.collectors.gc_pauses import GcPausesCollector
from pitstop.probe.collectors.memory import MemoryCollector
from pitstop.probe.collectors.recompute import RecomputeCollector
from pitstop.probe.collectors.sampled import SamplersCollector
from pitstop.probe.collectors.saves import SaveCollector
from pitstop.probe.collectors.syncs import SyncCollector
from pitstop.probe.collectors.threads import ThreadLoadCollector

COLLECTORS: tuple[type[Collector], ...] = (
    AttentionCollector,
    AutocastCollector,
    RecomputeCollector,
    CollateCollector,
    SyncCollector,
    SaveCollector,
    ThreadLoadCollector,
    GcPausesCollector,
    MemoryCollector,
    SamplersCollector,
    AttentionTimingCollector,  # after the others: it reads the environment they filled
    CollectivesCollector,  # last: its notes follow the probe's own in probe_errors
)

__all__ = ["COLLECTORS", "Collector", "ProbeContext", "overrides"]
