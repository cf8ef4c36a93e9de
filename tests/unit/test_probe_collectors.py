"""The probe's collectors: a signal added as one collector in the list is started, told of every step, stopped
and asked to fill the profile with no change to the probe; the window's counters start from zero; a collector
that fails stops none of the others. The probe is driven through the listener calls its hooks make (a real
optimizer and model, nothing trained)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pitstop.core.profile import Environment, RankProfile, StepRecord  # noqa: E402
from pitstop.core.vocabulary import Device  # noqa: E402
from pitstop.probe import probe as probemod  # noqa: E402
from pitstop.probe.collectors import COLLECTORS, Collector  # noqa: E402
from pitstop.probe.collectors.collectives import CollectivesCollector  # noqa: E402
from pitstop.probe.collectors.compiles import CompileCollector  # noqa: E402
from pitstop.probe.collectors.ddp import DdpCollector  # noqa: E402
from pitstop.probe.collectors.gc_pauses import GcPausesCollector  # noqa: E402
from pitstop.probe.collectors.memory import MemoryCollector  # noqa: E402
from pitstop.probe.collectors.samplers import SamplersCollector  # noqa: E402
from pitstop.probe.collectors.saves import SaveCollector  # noqa: E402
from pitstop.probe.config import ProbeConfig  # noqa: E402
from pitstop.probe.probe import Probe  # noqa: E402


class Loader:
    """Stands in for a DataLoader and its iterator: the probe keys batches by identity only."""


@dataclass
class StepsSeen:
    in_window: int = 0
    indices: list[int] = field(default_factory=list)


class Tally(Collector):
    """A made-up signal: the steps it saw, the window's counted from zero."""

    calls: list[str]

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.calls = []
        self.counts = StepsSeen()
        self.filled: list[RankProfile] = []

    def begin(self) -> None:
        self.calls.append("begin")

    def start_window(self) -> None:
        self.calls.append("start_window")
        self.counts = StepsSeen(indices=self.counts.indices)

    def step_end(self, record: StepRecord) -> None:
        self.counts.in_window += 1
        self.counts.indices.append(record.index)

    def stop_window(self) -> None:
        self.calls.append("stop_window")

    def fill(self, draft: RankProfile) -> None:
        self.filled.append(draft)


class Job:
    """A model, its optimizer and a loader, stepped as the hooks report it: a batch, forward, backward (SDPA
    inside), the optimizer's step."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.model = torch.nn.Linear(4, 4)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.it, loader = Loader(), Loader()
        probe.on_iterator(self.it, loader)

    def run(self, steps: int, sdpa_per_step: int = 0) -> None:
        probe = self.probe
        for _ in range(steps):
            if probe.finished:
                return
            probe.on_batch(self.it, {"input_ids": torch.ones(2, 3, dtype=torch.long)}, 0.0)
            probe.on_forward(self.model, (), {})
            probe.on_backward(True)
            for i in range(sdpa_per_step):
                probe.on_sdpa(has_mask=i == 0)
            probe.on_backward(False)
            probe.on_optimizer(self.opt, True)
            probe.on_optimizer(self.opt, False)


def test_a_collector_in_the_list_is_measured_with_no_change_to_the_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(probemod, "COLLECTORS", (*COLLECTORS, Tally))
    done: list[RankProfile] = []
    probe = Probe(ProbeConfig(warmup=2, steps=3, announce=False), on_done=done.append)
    Job(probe).run(8)
    tally = next(c for c in probe.collectors if isinstance(c, Tally))
    assert tally.calls == ["begin", "start_window", "stop_window"]  # begin at step 1, the window after step 2
    assert tally.counts.indices == [1, 2, 3, 4, 5]  # every step, warm-up included; the probe stopped at 5
    assert tally.counts.in_window == 3  # counted from zero at the window's start
    assert done and tally.filled == [done[0]]  # the draft it filled is the profile handed over
    assert [s.index for s in done[0].steps] == [3, 4, 5]


def test_only_collectors_with_work_per_step_are_called_per_step() -> None:
    """A collector without ``step_end`` costs a step nothing: the probe calls only those that have one."""
    probe = Probe(ProbeConfig(announce=False))
    owners = {type(c) for c in probe.collectors if any(c.step_end == f for f in probe._step_ends)}
    assert (
        owners
        == {
            SaveCollector,
            MemoryCollector,
            CollectivesCollector,
            GcPausesCollector,
            CompileCollector,
            DdpCollector,
        }
        and len(probe._step_ends) == 6
    )
    streams = {type(c) for c in probe.collectors if any(c.stream == f for f in probe._streamers)}
    assert streams == {SamplersCollector} and len(probe._streamers) == 1


def test_the_window_counts_only_its_own_calls() -> None:
    """SDPA calls of the warm-up steps are not the window's: 3 per step over 3 measured steps, 1 masked each."""
    probe = Probe(ProbeConfig(warmup=2, steps=3, announce=False))
    Job(probe).run(8, sdpa_per_step=3)
    attention = probe.rank_profile().environment.attention
    assert (attention.sdpa_calls, attention.sdpa_calls_with_mask) == (9, 3)


def test_a_save_before_the_window_or_after_its_end_is_not_counted() -> None:
    probe = Probe(ProbeConfig(warmup=2, steps=3, announce=False))
    saves = next(c for c in probe.collectors if isinstance(c, SaveCollector))
    saves.on_save("torch.save", 1.0)  # before the window: nothing is counted yet
    job = Job(probe)
    job.run(3)  # the window starts after step 2; step 3 is measured
    saves.on_save("torch.save", 0.25)  # in step 4
    job.run(3)  # steps 4 and 5: the window ends
    saves.on_save("torch.save", 2.0)  # after the last step
    checkpoints = probe.rank_profile().checkpoints
    assert checkpoints is not None
    assert (checkpoints.saves, checkpoints.save_s, checkpoints.steps_with_saves) == (1, 0.25, 1)
    # the save on the record of the step that waited for it: a watched window of steps has its saves
    charged = {s.index: s.checkpoints for s in probe.rank_profile().steps if s.checkpoints is not None}
    assert charged == {4: checkpoints}


class Broken(Collector):
    def stop_window(self) -> None:
        raise RuntimeError("stuck")


def test_a_collector_that_fails_to_stop_stops_none_of_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probemod, "COLLECTORS", (Broken, *COLLECTORS))
    probe = Probe(ProbeConfig(warmup=1, steps=2, announce=False))
    Job(probe).run(4)
    assert probe.finished
    profile = probe.rank_profile()
    assert "Broken.stop_window: RuntimeError: stuck" in profile.probe_errors
    samplers = next(c for c in probe.collectors if isinstance(c, SamplersCollector))
    assert samplers.host is None or samplers.host._stop.is_set()  # stopped after the broken one failed


def test_the_allocator_is_read_at_every_step_end_of_the_window_and_not_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GPU the memory collector keeps the allocator's counters at the window's start and at each step end
    (under the adaptive window too: every window rule closes steps the same way), and none once it stopped."""
    allocs = iter([10, 10, 14, 14, 99])  # the window's start, three step ends, the peaks' read in fill
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {"num_device_alloc": next(allocs)})
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 7)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 9)
    probe = Probe(ProbeConfig(announce=False))
    probe.ctx.environment = Environment(device=Device.CUDA)
    memory = next(c for c in probe.collectors if isinstance(c, MemoryCollector))
    memory.start_window()
    for index in (3, 4, 5):
        memory.step_end(StepRecord(index=index, wall_s=0.1))
    memory.stop_window()
    memory.step_end(StepRecord(index=6, wall_s=0.1))  # after the window: not read
    draft = RankProfile(environment=Environment(device=Device.CUDA))
    memory.fill(draft)  # the peaks read once more, at the end
    stats = draft.memory
    assert (stats.window_steps, stats.window_device_allocs, stats.steps_with_device_allocs) == (3, 4, 1)
    assert (stats.peak_allocated, stats.peak_reserved) == (7, 9)


@contextlib.contextmanager
def no_automatic_gc() -> Iterator[None]:
    """Only the test's own collections run (an automatic one could land anywhere)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def test_a_full_collection_in_the_window_is_timed_and_none_after_its_end() -> None:
    probe = Probe(ProbeConfig(warmup=2, steps=3, announce=False))
    collector = next(c for c in probe.collectors if isinstance(c, GcPausesCollector))
    job = Job(probe)
    with no_automatic_gc():
        gc.collect(2)  # before the window: not watched
        job.run(2)  # the window starts after step 2
        garbage: list[object] = []
        garbage.append(garbage)  # a cycle: only the collector frees it
        del garbage
        gc.collect(2)  # in step 3
        job.run(1)
        gc.collect(2)  # in step 4
        gc.collect(0)
        job.run(2)  # steps 4 and 5: the window ends, the callback goes
        gc.collect(2)  # after the window
    assert probe.finished and collector._on_gc not in gc.callbacks
    pauses = probe.rank_profile().gc_pauses
    assert pauses is not None and pauses.enabled is False and pauses.frozen is not None
    young, _, full = pauses.generations
    assert (full.collections, full.steps) == (2, 2) and full.collected >= 1
    assert (young.collections, young.steps) == (1, 1)
    assert full.pause_s >= full.longest_s > 0 and pauses.pause_s >= full.pause_s
    # each step's own collections on its record: a watched window of steps has its pauses
    by_step = {s.index: s.gc_pauses for s in probe.rank_profile().steps}
    step3, step4 = by_step[3], by_step[4]
    assert step3 is not None and [g.collections for g in step3.generations] == [0, 0, 1]
    assert (
        step4 is not None and [g.collections for g in step4.generations] == [1, 0, 1] and by_step[5] is None
    )
    assert step3.pause_s + step4.pause_s == pytest.approx(pauses.pause_s)


def test_gc_counters_are_fresh_at_each_window_and_the_callback_never_raises() -> None:
    probe = Probe(ProbeConfig(announce=False))
    collector = next(c for c in probe.collectors if isinstance(c, GcPausesCollector))
    assert probe.rank_profile().gc_pauses is None  # no window: not watched
    with no_automatic_gc():
        collector.start_window()
        gc.collect(2)
        first = collector.counts
        collector.stop_window()
        collector.start_window()
        assert collector.counts is not first and collector.counts.generations[2].collections == 0
        probe.ctx.step_index = lambda: 1 // 0  # a failing read inside the callback stays inside it
        gc.collect(2)
        collector.stop_window()
        collector.stop_window()  # safe twice
    assert first.generations[2].collections == 1 and collector._on_gc not in gc.callbacks
