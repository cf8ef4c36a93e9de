"""Threads against cores: the thread pools, $OMP_NUM_THREADS, ranks and cores the job has (read at the first
step) and its runnable threads during the window (``probe.cpu_threads`` samples /proc on a thread of its own
from the window's start; the means go into the environment's ``cpu``)."""

from __future__ import annotations

from pitstop.probe.collectors.base import Collector, ProbeContext, collector
from pitstop.probe.cpu_threads import ThreadLoad, thread_facts
from pitstop.profile import RankProfile


@collector
class ThreadLoadCollector(Collector):
    """The counters are ``ThreadLoad``'s samples; None until the window starts."""

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.load: ThreadLoad | None = None

    def begin(self) -> None:
        if self.ctx.environment is not None:
            self.ctx.environment.cpu = thread_facts()  # what the job asked for: pools, OMP, ranks, cores

    def start_window(self) -> None:
        self.load = ThreadLoad()

    def stop_window(self) -> None:
        if self.load is not None:
            self.load.stop()

    def fill(self, draft: RankProfile) -> None:
        cpu = draft.environment.cpu
        if self.load is not None and cpu is not None:
            self.load.stop_into(cpu)
