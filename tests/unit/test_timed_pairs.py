"""The timing pitstop runs itself after a window (``probe/timing.py``), on a fake clock and fake paths: pairs
interleaved A B, B A, ...; stopping once the per-pair ratios settle, or at the time cap (never under three
pairs) or the pair cap; a CPU timing under other processes' load is not stable; the load read from a
``/proc/stat`` in its documented layout; and several compared paths combined into one spread."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from itertools import cycle
from pathlib import Path

import pytest
from tests.factories import profile, steps

from pitstop.core.profile import AttentionTiming, RunProfile, TimingSpread
from pitstop.probe.timing import (
    MAX_PAIRS,
    MIN_PAIRS,
    LoadMeter,
    MachineLoad,
    PairTiming,
    combined,
    quartiles,
    time_pair,
)

QUIET = MachineLoad(others_cores=0.1, load_per_core=0.3, cores=2)
BUSY = MachineLoad(others_cores=1.9, load_per_core=2.1, cores=2)


class FakeClock:
    """A clock that only the fake paths move."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeMeter(LoadMeter):
    """A load meter that reports a load chosen by the test."""

    def __init__(self, load: MachineLoad) -> None:
        self.load = load

    def start(self) -> None:
        pass

    def stop(self) -> MachineLoad:
        return self.load


def path(clock: FakeClock, name: str, durations: list[float], calls: list[str]) -> Callable[[], None]:
    """A path that takes the next of ``durations`` (cycled) on the fake clock and logs its call."""
    each = cycle(durations)

    def run() -> None:
        calls.append(name)
        clock.now += next(each)

    return run


def test_steady_paths_stop_stable_at_the_first_judged_pair_with_the_exact_ratio() -> None:
    clock, calls = FakeClock(), []  # type: list[str]
    timing = time_pair(
        path(clock, "A", [0.02], calls),
        path(clock, "B", [0.01], calls),
        clock=clock,
        meter=FakeMeter(QUIET),
    )
    assert timing.repeats == MIN_PAIRS and timing.stable
    assert timing.ratio == timing.ratio_low == timing.ratio_high == pytest.approx(2.0)
    assert (timing.first_s, timing.second_s) == (pytest.approx(0.02), pytest.approx(0.01))
    assert timing.spread == pytest.approx(0.0)
    # one warm-up of each, then pairs interleaved A B, B A, A B, ...: a drift falls on both paths alike
    assert calls[:2] == ["A", "B"]
    assert calls[2:] == ["A", "B", "B", "A", "A", "B", "B", "A", "A", "B"]


def test_a_path_that_swings_keeps_adding_pairs_until_the_time_cap_and_is_not_stable() -> None:
    clock, calls = FakeClock(), []  # type: list[str]
    # the first path takes 1, 3, 1.5, 2.5 s in turn against a steady 1 s: ratios spread far over 10%
    timing = time_pair(
        path(clock, "A", [1.0, 3.0, 1.5, 2.5], calls),
        path(clock, "B", [1.0], calls),
        clock=clock,
        meter=FakeMeter(QUIET),
        max_seconds=30.0,
        warmup=0,
    )
    assert not timing.stable
    assert timing.repeats == 11  # the pair that passed 30 s of fake time was the last
    # not settled: the range is every pair's, lowest to highest (its quartiles would swing from run to run)
    assert (timing.ratio_low, timing.ratio_high) == (1.0, 3.0)
    assert 1.0 < timing.ratio < 3.0 and timing.spread > 0.10
    assert len(calls) == 2 * timing.repeats


def test_the_pair_cap_ends_a_timing_that_never_settles() -> None:
    clock, calls = FakeClock(), []  # type: list[str]
    timing = time_pair(
        path(clock, "A", [1.0, 2.0], calls),
        path(clock, "B", [1.0], calls),
        clock=clock,
        meter=FakeMeter(QUIET),
        max_seconds=1e9,
    )
    assert timing.repeats == MAX_PAIRS and not timing.stable


def test_a_slow_path_still_gets_three_pairs_past_the_time_cap_but_is_not_judged_stable() -> None:
    clock, calls = FakeClock(), []  # type: list[str]
    timing = time_pair(
        path(clock, "A", [5.0], calls),
        path(clock, "B", [5.0], calls),
        clock=clock,
        meter=FakeMeter(QUIET),
        max_seconds=1.0,
    )
    assert timing.repeats == 3 and timing.ratio == pytest.approx(1.0)
    assert not timing.stable  # fewer pairs than MIN_PAIRS: the spread was never judged
    assert timing.ratio_low == timing.ratio_high == pytest.approx(1.0)  # its range: every pair's


def test_a_cpu_timing_under_load_is_not_stable_however_close_its_pairs() -> None:
    clock, calls = FakeClock(), []  # type: list[str]
    a, b = path(clock, "A", [0.02], calls), path(clock, "B", [0.01], calls)
    loaded = time_pair(a, b, clock=clock, meter=FakeMeter(BUSY))
    assert (
        loaded.ratio == pytest.approx(2.0) and loaded.ratio_high == pytest.approx(2.0) and loaded.load.loaded
    )
    # close pairs, but other work on the cores: not stable, and the range reaches no gain at all
    assert not loaded.stable and loaded.ratio_low == 1.0
    on_gpu = time_pair(a, b, clock=clock, meter=FakeMeter(BUSY), cpu_bound=False)
    assert on_gpu.stable and on_gpu.ratio_low == pytest.approx(2.0)  # a GPU's kernels do not share the cores
    record = loaded.record()
    assert record.under_load and not record.stable and record.repeats == MIN_PAIRS
    assert (record.others_cores, record.load_per_core, record.cores) == (1.9, 2.1, 2)


def test_the_device_is_synchronized_around_every_timed_run() -> None:
    clock, calls = FakeClock(), []  # type: list[str]
    time_pair(
        path(clock, "A", [0.02], calls),
        path(clock, "B", [0.01], calls),
        sync=lambda: calls.append("sync"),
        clock=clock,
        meter=FakeMeter(QUIET),
        warmup=0,
        min_pairs=1,
    )
    assert calls == ["sync", "A", "sync", "sync", "B", "sync"]


def test_quartiles_and_scaling() -> None:
    assert quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 3.0, 4.0)
    assert quartiles([2.0]) == (2.0, 2.0, 2.0)
    timing = PairTiming(0.02, 0.01, 2.0, 1.9, 2.1, 7, True, QUIET)
    scaled = timing.scaled(4.0)
    assert (scaled.first_s, scaled.second_s, scaled.ratio) == (0.08, 0.04, 2.0)


STAT_BEFORE = """\
cpu  1000 0 500 9000 100 0 10 0 0 0
cpu0 500 0 250 4500 50 0 5 0 0 0
cpu1 500 0 250 4500 50 0 5 0 0 0
intr 123456 0 0
ctxt 987654
"""
# 2 s (200 ticks a CPU) later: each CPU busy 170 ticks (user 150, system 15, softirq 5), the rest idle / iowait
STAT_AFTER = """\
cpu  1300 0 530 9050 110 0 20 0 0 0
cpu0 650 0 265 4530 50 0 10 0 0 0
cpu1 650 0 265 4520 60 0 10 0 0 0
intr 123999 0 0
ctxt 987999
"""


def test_the_load_is_other_processes_busy_cores_from_proc_stat(tmp_path: Path) -> None:
    """``/proc/stat``'s layout (proc(5)): per-CPU jiffies user nice system idle iowait irq softirq steal guest
    guest_nice; busy is all but idle and iowait, less this process's own CPU time."""
    stat = tmp_path / "stat"
    stat.write_text(STAT_BEFORE)
    wall, own = iter([100.0, 102.0]), iter([10.0, 11.0])  # 2 s of wall time, 1 s of this process's CPU
    meter = LoadMeter(stat=stat, cores=2, wall=lambda: next(wall), own_cpu=lambda: next(own), cpus={0, 1})
    meter.start()
    stat.write_text(STAT_AFTER)
    load = meter.stop()
    ticks = 100  # SC_CLK_TCK on Linux
    busy_s = (170 + 170) / ticks  # cpu0 150+15+5, cpu1 150+15+5
    assert load.others_cores == pytest.approx((busy_s - 1.0) / 2.0)
    assert load.loaded  # 1.2 of 2 cores busy with other work
    only_cpu1 = LoadMeter(stat=stat, cores=1, wall=iter([0.0, 2.0]).__next__, own_cpu=lambda: 0.0, cpus={1})
    stat.write_text(STAT_BEFORE)
    only_cpu1.start()
    stat.write_text(STAT_AFTER)
    assert only_cpu1.stop().others_cores == pytest.approx(min(1.0, 1.7 / 2.0))


def test_without_proc_stat_the_load_is_unknown_and_never_loaded(tmp_path: Path) -> None:
    meter = LoadMeter(stat=tmp_path / "missing", cores=2)
    meter.start()
    load = meter.stop()
    assert load.others_cores is None and not load.loaded


def test_paths_combined_weigh_each_ratio_by_its_dense_seconds_and_need_all_stable() -> None:
    small = PairTiming(0.003, 0.001, 3.0, 2.8, 3.2, 9, True, QUIET)  # × 4 layers
    large = PairTiming(0.015, 0.010, 1.5, 1.4, 1.6, 6, False, BUSY)  # × 2 layers
    spread = combined([(small, 4), (large, 2)])
    assert spread is not None
    weights = 4 * 0.001 + 2 * 0.010
    assert spread.ratio == pytest.approx((3.0 * 0.004 + 1.5 * 0.020) / weights)
    assert spread.ratio_low == 1.0  # one part ran under load: the sum cannot rule out no gain either
    assert spread.ratio_high == pytest.approx((3.2 * 0.004 + 1.6 * 0.020) / weights)
    assert spread.repeats == 6 and not spread.stable and spread.under_load
    quiet = combined([(small, 4), (dataclasses.replace(large, stable=True, load=QUIET), 2)])
    assert quiet is not None and quiet.stable and not quiet.under_load
    assert quiet.ratio_low == pytest.approx((2.8 * 0.004 + 1.4 * 0.020) / weights)
    assert spread.others_cores == 1.9
    assert combined([]) is None


def test_a_spread_survives_a_saved_profile() -> None:
    spread = TimingSpread(
        ratio=1.5, ratio_low=1.2, ratio_high=1.9, repeats=12, stable=False, under_load=True, others_cores=1.6
    )
    timing = AttentionTiming(
        eager_s=0.02,
        fused_s=0.01,
        rows=8,
        heads=4,
        seq=256,
        head_dim=32,
        dtype="float32",
        rows_timed=8,
        spread=spread,
    )
    p = profile("cpu", steps(n=4, wall=0.1, rows=8, row_len=256))
    p.ranks[0].attention_timing = timing
    back = RunProfile.from_dict(p.to_dict())
    assert back.ranks[0].attention_timing == timing


@pytest.mark.slow  # imports torch and times up to MAX_SECONDS
def test_the_attention_collector_keeps_the_pairs_spread_and_load_beside_the_medians() -> None:
    """A real timing on this CPU (tiny shapes): whatever the machine's load, the record says how it went."""
    import torch

    from pitstop.core.profile import AttentionInfo
    from pitstop.probe.collectors.attention_timing import AttentionTimingCollector
    from pitstop.probe.collectors.base import ProbeContext

    errors: list[str] = []
    ctx = ProbeContext(
        config=None,  # type: ignore[arg-type]
        origin=0.0,
        hooks=None,  # type: ignore[arg-type]
        errors=errors,
        disable=lambda exc: None,
        step_index=lambda: 1,
    )
    ctx.device = torch.device("cpu")
    draft = profile(
        "cpu",
        steps(n=4, wall=0.1, rows=2, row_len=64),
        attention=AttentionInfo(implementation="eager", sdpa_calls=0, sdpa_calls_with_mask=0),
    ).ranks[0]
    state = torch.random.get_rng_state()
    collector = AttentionTimingCollector(ctx)
    collector.closing()
    collector.fill(draft)
    timing = draft.attention_timing
    assert errors == [] and timing is not None and timing.spread is not None
    spread = timing.spread
    assert spread.repeats >= 3 and spread.ratio_low <= spread.ratio <= spread.ratio_high
    assert spread.cores and spread.cores >= 1
    if spread.stable:  # only pairs that settled, on a machine not busy with other work
        assert spread.ratio_high - spread.ratio_low <= 0.1 * spread.ratio and not spread.under_load
    if spread.under_load:  # the load may have made either path slower: no gain is not ruled out
        assert spread.ratio_low <= 1.0
    assert torch.equal(torch.random.get_rng_state(), state)  # a private generator: the job's untouched


@pytest.mark.slow  # a tiny Mixtral from Transformers, timed
def test_the_experts_switch_is_timed_in_pairs_and_keeps_its_spread() -> None:
    from tests.unit.test_moe_experts_loop import _collect, _tiny

    info, errors = _collect(_tiny("mixtral", "eager"))
    assert errors == [] and info is not None and info.loop_s and info.grouped_s
    spread = info.switch_spread
    assert spread is not None and spread.repeats >= 3
    assert spread.ratio_low <= spread.ratio <= spread.ratio_high
    assert spread.stable or spread.ratio_high > spread.ratio_low or spread.under_load


@pytest.mark.slow  # a tiny 4-bit Llama through Transformers' BitsAndBytesConfig
def test_the_quantized_layers_are_timed_in_pairs_and_combined_into_one_spread() -> None:
    import sys

    import torch

    pytest.importorskip("bitsandbytes", reason="bitsandbytes not installed (the dev extra)")
    pytest.importorskip("peft", reason="peft not installed (the hf extra)")
    from tests.conftest import SCRIPTS

    from pitstop.probe.collectors.quantized import describe, quantized_linears, time_quantized

    sys.path.insert(0, str(SCRIPTS))
    from qlora_loop import qlora_model

    model = qlora_model("4bit", "float32", hidden=64, layers=1)
    layers = quantized_linears(model)
    base = time_quantized(describe(model, layers), layers, 64, 1, True, torch.device("cpu"), "cpu")
    spread = base.spread
    assert spread is not None and spread.repeats >= 3 and spread.cores
    assert spread.ratio_low <= spread.ratio <= spread.ratio_high
    assert base.quantized_s and base.dense_s  # the medians the spread sits beside
    if spread.under_load:
        assert spread.ratio_low <= 1.0 and not spread.stable
