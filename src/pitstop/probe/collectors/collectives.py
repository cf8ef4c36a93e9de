"""Collectives: every torch.distributed collective and DDP bucket, timed from the probe's installation on
(``probe.collectives`` wraps them); each step's counts on its record, the window's records in the profile,
and the job's distributed facts (backend, hosts, transport settings) in the environment."""

from __future__ import annotations

from pitstop.probe import collectives as collmod
from pitstop.probe.collectors.base import Collector, ProbeContext, collector
from pitstop.profile import RankProfile, StepRecord


@collector
class CollectivesCollector(Collector):
    """The counters are ``CollectiveRecorder``'s records and per-step totals."""

    order = 100  # last: its notes follow the probe's own in probe_errors

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.recorder = collmod.CollectiveRecorder(ctx.origin, ctx.step_index, ctx.disable)

    def install(self) -> None:
        self.recorder.install()

    def remove(self) -> None:
        self.recorder.remove()

    def begin(self) -> None:
        if self.ctx.environment is not None:
            collmod.describe(self.ctx.environment)
        if self.ctx.on_cuda:
            self.recorder.use_device_clock()

    def step_end(self, record: StepRecord) -> None:
        self.recorder.close_step(record)

    def stop_window(self) -> None:
        self.recorder.active = False

    def fill(self, draft: RankProfile) -> None:
        steps = draft.steps
        draft.collectives = self.recorder.resolve(steps[0].index, steps[-1].index) if steps else []
        draft.probe_errors += self.recorder.notes()
