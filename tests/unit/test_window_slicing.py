"""A watched window is sliced from the run's profile (``wholerun/slicing.py``): its steps and what was measured
in them, the collectors' per-step counts included, so gc pauses and checkpoint saves reach the window they
happened in, and the rules find them there."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from tests.factories import gpu_samples
from tests.unit.test_wholerun import series

from pitstop.core.profile import (
    CollectiveRecord,
    Environment,
    GcGeneration,
    GcPauses,
    GpuSample,
    MemoryStats,
    RankProfile,
    RunProfile,
    SaveStats,
    StepRecord,
)
from pitstop.core.vocabulary import CauseId, Device, Source
from pitstop.diagnose import diagnose
from pitstop.wholerun.run import WholeRun
from pitstop.wholerun.slicing import merge_gc, slice_rank, slice_run, step_span
from pitstop.wholerun.windows import FindingBrief, WindowSpec

FULL_S = 0.12  # a full collection's pause, planted every 4th step of a window: ~25% of its time


def full_collection() -> GcPauses:
    """What the collector charges to a step in which one full (generation 2) collection ran."""
    return GcPauses(
        [
            GcGeneration(),
            GcGeneration(),
            GcGeneration(collections=1, pause_s=FULL_S, longest_s=FULL_S, steps=1),
        ]
    )


def one_save(seconds: float = 0.5) -> SaveStats:
    return SaveStats(saves=1, save_s=seconds, steps_with_saves=1, calls={"torch.save": 1})


def planted(n: int = 300) -> list[StepRecord]:
    """Steps 101-200 stall in full gc collections (every 4th step), steps 201-300 in checkpoint saves (every
    20th); the time is in the step's wall and between steps, where the loop waited."""
    steps = series(n)
    for s in steps:
        if 100 < s.index <= 200 and s.index % 4 == 0:
            s.gc_pauses = full_collection()
            s.wall_s += FULL_S
        if 200 < s.index <= 300 and s.index % 20 == 0:
            s.checkpoints = one_save()
            s.wall_s += 0.5
    t = 100.0  # the probe's clock: each step ends where the next starts
    for s in steps:
        t += s.wall_s
        s.end_t = t
    return steps


def causes(window_findings: Sequence[FindingBrief]) -> set[CauseId]:
    return {f.cause for f in window_findings}


def test_a_watch_window_finds_the_gc_pauses_and_the_saves_of_its_own_steps() -> None:
    run = WholeRun(WindowSpec(steps=100))
    run.add(0, planted(), Environment(device=Device.CPU, framework="pytorch", world_size=1))
    _, report = run.finish()
    first, gc, saves = report.windows
    assert CauseId.GC_PAUSES in causes(gc.findings) and CauseId.CHECKPOINT_STALL not in causes(gc.findings)
    assert CauseId.CHECKPOINT_STALL in causes(saves.findings) and CauseId.GC_PAUSES not in causes(
        saves.findings
    )
    assert not causes(first.findings) & {CauseId.GC_PAUSES, CauseId.CHECKPOINT_STALL}
    brief = gc.finding(CauseId.GC_PAUSES)
    assert brief is not None and "25 full collections in 25 of 100 steps" in brief.summary


def test_a_window_sliced_from_a_whole_profile_keeps_what_was_measured_in_its_steps() -> None:
    steps = planted()
    ends = [s.end_t or 0.0 for s in steps]
    rank = RankProfile(
        rank=0,
        warmup_steps=10,
        steps=steps,
        environment=Environment(device=Device.CPU, framework="pytorch", world_size=1),
        gpu_samples=[GpuSample(t=100.0 + 0.5 * i, util=90.0) for i in range(80)],  # 100 s to 139.5 s
        window_start_t=100.0,
        window_end_t=ends[-1],
        memory=MemoryStats(peak_allocated=1 << 30),
        gc_pauses=merge_gc(
            (s.gc_pauses for s in steps if s.gc_pauses is not None), GcPauses(enabled=True, tracked=2_000_000)
        ),
        collectives=[
            CollectiveRecord(step=i, op="all_reduce", group="0", seq=i, bytes=8, size=1, issued_t=0.0)
            for i in (50, 150, 250)
        ],
    )
    whole = RunProfile(source=Source.DOCTOR, ranks=[rank])

    part = slice_rank(rank, 101, 200)
    assert part is not None and [s.index for s in part.steps] == list(range(101, 201))
    assert part.warmup_steps == 100  # step numbers stay the run's
    span = step_span(rank, part.steps)
    assert span is not None and span == pytest.approx((ends[99], ends[199]))
    assert [s.t for s in part.gpu_samples] == [s.t for s in rank.gpu_samples if span[0] <= s.t <= span[1]]
    assert (part.window_start_t, part.window_end_t) == span
    assert [c.step for c in part.collectives] == [150]
    gc = part.gc_pauses
    assert gc is not None and gc.generations[2].collections == 25 and gc.pause_s == pytest.approx(25 * FULL_S)
    assert (gc.enabled, gc.tracked) == (True, 2_000_000)  # the collector's settings are the rank's
    assert part.checkpoints is not None and part.checkpoints.saves == 0  # counted per step: none in these
    assert part.memory == MemoryStats()  # a window-wide peak belongs to no part of it

    # the same window sliced from the run's profile is what the rules see in it
    found = {f.cause for f in diagnose(slice_run(whole, 101, 200)).findings}
    assert CauseId.GC_PAUSES in found
    assert CauseId.GC_PAUSES not in {f.cause for f in diagnose(slice_run(whole, 1, 100)).findings}
    assert slice_run(whole, 301, 400).ranks == []

    # the whole of it is the profile itself; a source that did not charge its figures to steps keeps them
    # for the whole only
    all_of_it = slice_rank(rank, 1, 300)
    assert all_of_it is not None and all_of_it.gc_pauses is rank.gc_pauses and all_of_it.memory == rank.memory
    assert [s.t for s in all_of_it.gpu_samples] == [s.t for s in rank.gpu_samples if s.t <= ends[-1]]
    unsplit = dataclasses.replace(rank, steps=[dataclasses.replace(s, gc_pauses=None) for s in steps])
    part, all_of_it = slice_rank(unsplit, 101, 200), slice_rank(unsplit, 1, 300)
    assert part is not None and part.gc_pauses is None
    assert all_of_it is not None and all_of_it.gc_pauses is rank.gc_pauses


def test_gpu_samples_go_to_the_window_their_time_falls_in() -> None:
    steps = planted(200)
    run = WholeRun(WindowSpec(steps=100))
    env = Environment(device=Device.CUDA, world_size=1)
    # samples fed ahead of the steps, as a rank file's lines come: the first window's and the second's
    ends = [s.end_t or 0.0 for s in steps]
    busy = [GpuSample(t=t - 0.01, util=90.0, power_w=300.0) for t in ends[:100]]
    idle = [GpuSample(t=t - 0.01, util=10.0, power_w=100.0) for t in ends[100:]]
    run.add_gpu(0, busy + idle[:50])
    (event,) = run.add(0, steps[:150], env)
    assert event.window.gpu_power_w == pytest.approx(300.0)  # the later samples wait for their window
    run.add_gpu(0, idle[50:])
    _, report = run.finish()
    assert report.windows[1].gpu_power_w == pytest.approx(100.0)


def test_without_step_times_a_window_takes_the_samples_fed_while_it_was_open() -> None:
    run = WholeRun(WindowSpec(steps=100))
    run.add_gpu(0, gpu_samples(95.0))  # the factory's samples: 0 to 0.95 s, no step time to place them by
    (event,) = run.add(0, series(100), Environment(device=Device.CUDA, world_size=1))
    assert event.window.gpu_power_w == pytest.approx(400.0)
