"""Python's cyclic garbage collector in the window: every collection, per generation, timed.

A ``gc.callbacks`` callback is registered at the window's start and removed at its end, so a job pays for it
only while it is measured, and then two ``perf_counter`` reads and a few additions per collection. It reads
the clock and the collection's info dict and nothing else: the job's objects and what it computes are
untouched. Explicit ``gc.collect()`` calls are counted too (the callbacks run for them as well), and told
apart: ``automatic`` holds the same counts without them (the job's calls are timed as calls, by
``collectors.job_calls``, and are per_step_cleanup's, not the collector's pauses). A collection is charged to
the step under way when it ends. After the window, only when full collections ran in it, the
tracked objects are counted once: what a full collection traverses, which the estimate needs.
"""

from __future__ import annotations

import contextlib
import gc
from time import perf_counter

from pitstop.core.profile import GcGeneration, GcPauses, RankProfile, StepRecord
from pitstop.probe.collectors.base import ProbeContext, WindowCounts, collector
from pitstop.probe.collectors.job_calls import collecting_by_hand

OLDEST = 2  # the full collection; a newer interpreter's extra generations count as the oldest


def _split() -> GcPauses:
    """Counts with the automatic collections apart (the ``gc_pauses`` of one step, or of the window)."""
    return GcPauses(automatic=[GcGeneration() for _ in range(OLDEST + 1)])


@collector
class GcPausesCollector(WindowCounts[GcPauses]):
    """The counters are the profile's ``GcPauses``, fresh at each window start."""

    counts_type = GcPauses

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self._started: float | None = None  # perf_counter at the collection now running
        self._by_hand = False  # the collection now running was started by an explicit gc.collect()
        self._last_step = [0, 0, 0]  # per generation: the last step it was counted in
        self._last_auto = [0, 0, 0]  # the same, for the automatic collections
        self._step = _split()  # the collections of the step under way, charged to its record at its end
        self._registered = False

    def start_window(self) -> None:
        super().start_window()
        self.counts = _split()
        self.counts.enabled = gc.isenabled()
        self.counts.thresholds = list(gc.get_threshold())
        self._last_step = [0, 0, 0]
        self._last_auto = [0, 0, 0]
        self._step = _split()
        self._started = None
        if not self._registered:
            gc.callbacks.append(self._on_gc)
            self._registered = True

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        """Called by the interpreter at each collection's start and stop; never raises into the job."""
        try:
            if phase == "start":
                self._started = perf_counter()
                self._by_hand = collecting_by_hand()
                return
            started, self._started = self._started, None
            if started is None:  # registered while a collection ran
                return
            seconds = perf_counter() - started
            index = min(int(info.get("generation", OLDEST)), OLDEST)
            found = int(info.get("collected", 0)) + int(info.get("uncollectable", 0))
            counted = [(self.counts.generations, self._step.generations, self._last_step)]
            if not self._by_hand and self.counts.automatic is not None and self._step.automatic is not None:
                counted.append((self.counts.automatic, self._step.automatic, self._last_auto))
            step = self.ctx.step_index()
            for window, this_step, last in counted:
                for generation in (window[index], this_step[index]):
                    generation.collections += 1
                    generation.pause_s += seconds
                    generation.longest_s = max(generation.longest_s, seconds)
                    generation.collected += found
                this_step[index].steps = 1
                if last[index] != step:
                    last[index] = step
                    window[index].steps += 1
        except Exception:  # a figure lost is better than an error inside the job's collection
            return

    def step_end(self, record: StepRecord) -> None:
        """The step's own collections on its record, so a window of steps has its pauses."""
        if any(g.collections for g in self._step.generations):
            record.gc_pauses, self._step = self._step, _split()

    def stop_window(self) -> None:
        if self._registered:
            with contextlib.suppress(ValueError):  # the job cleared gc.callbacks itself
                gc.callbacks.remove(self._on_gc)
            self._registered = False

    def remove(self) -> None:
        self.stop_window()

    def fill(self, draft: RankProfile) -> None:
        if self.counts.enabled is None:  # the window never started: nothing was watched
            return
        if self.counts.frozen is None:
            # after the window, never inside a step: counting frozen objects walks their list once
            self.counts.frozen = gc.get_freeze_count()
        if self.counts.tracked is None and self.counts.generations[OLDEST].collections:
            # what a full collection traverses, for the estimate: a list of references, freed at once
            # (8 bytes and ~20 ns per tracked object, once, only when full collections ran in the window)
            self.counts.tracked = len(gc.get_objects())
        draft.gc_pauses = self.counts
