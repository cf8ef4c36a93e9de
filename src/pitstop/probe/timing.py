"""Two paths timed against each other until the comparison is stable, for the timings pitstop runs itself after
a window (eager against fused attention, the experts' loop against grouped GEMMs, quantized against dense
linears).

One median of each path, timed one after the other, swings with whatever else the machine does meanwhile: a
burst of load during the first path's passes and not the second's moves their ratio by tens of percent, and a
severity graded on it changes between two runs of the same script. Here the paths are timed in interleaved
pairs (A B, B A, A B, ...: a drift in the machine's speed falls on both alike), each pair gives one ratio, and
pairs are added until the ratios' interquartile range is within ``TARGET_SPREAD`` of their median or
``MAX_SECONDS`` has passed. What comes back says how far to trust the ratio: its quartiles, the pairs timed,
and the load other processes put on the machine's cores meanwhile (``/proc/stat`` over this process's cores,
less this process's own CPU time). A comparison is stable when its spread is within the target and, where the
paths run on the CPU, other processes kept under ``LOADED_SHARE`` of its cores busy. A stable ratio's range is
its quartiles; one that is not reports the lowest and highest pair, the range a rule grades on the low end of
(a noisy timing's quartiles swing with the load as much as its median does). Under load the range reaches 1
(no difference): other processes on the cores slow a path of many small parallel operations (eager
attention's matmul, mask, softmax, each a parallel region whose threads wait on one another) far more than a
fused one (on a busy 2-core machine eager attention at 256 tokens took 47 ms in one timing and 663 ms in
another, the fused kernel 18 and 91 ms), so a loaded timing cannot rule out that the paths run alike on a quiet
one.

The clock, the device synchronization and the load reading are injected, so the stopping rule is tested with a
fake clock and fake paths.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from pitstop.core.profile import TimingSpread
from pitstop.cpus import cores_allowed

TARGET_SPREAD = 0.10  # the ratios' interquartile range over their median at which the timing stops, stable
MIN_PAIRS = 5  # pairs timed before the spread is judged (fewer give no meaningful quartiles)
FLOOR_PAIRS = 3  # pairs always timed, even past the time cap (a ratio and its quartiles need three)
MAX_PAIRS = 41  # pairs timed at most: past this the paths are as stable as they will get
MAX_SECONDS = 3.0  # the timing stops adding pairs past this (after FLOOR_PAIRS)
WARMUP = 1  # untimed runs of each path first (kernel selection, allocator, caches)
LOADED_SHARE = 0.25  # other processes busy on this share of the cores: the CPU timing ran under load
STAT = Path("/proc/stat")


@dataclass(frozen=True)
class MachineLoad:
    """The machine's load while the paths were timed: other processes' busy cores (None where ``/proc/stat``
    cannot be read), the 1-minute load average per core, and the cores this process may use."""

    others_cores: float | None
    load_per_core: float | None
    cores: int

    @property
    def loaded(self) -> bool:
        return self.others_cores is not None and self.others_cores >= max(0.5, LOADED_SHARE * self.cores)


@dataclass(frozen=True)
class PairTiming:
    """Two paths timed in interleaved pairs: each path's median seconds, the median of the per-pair ratios
    (first over second) and their range (the quartiles where the ratio is stable; where it is not, the lowest
    and highest pair, since a noisy timing's quartiles themselves swing from run to run), the pairs timed,
    whether the ratio is stable, and the load."""

    first_s: float
    second_s: float
    ratio: float
    ratio_low: float
    ratio_high: float
    repeats: int
    stable: bool
    load: MachineLoad

    @property
    def spread(self) -> float:
        """The ratio's range over its median."""
        return (self.ratio_high - self.ratio_low) / self.ratio if self.ratio > 0 else float("inf")

    def scaled(self, factor: float) -> PairTiming:
        """Both paths' seconds × ``factor`` (times measured on fewer rows or tokens than the job's); the ratio
        stays."""
        return replace(self, first_s=self.first_s * factor, second_s=self.second_s * factor)

    def record(self) -> TimingSpread:
        """What the profile keeps of it (the rules read it)."""
        return TimingSpread(
            ratio=self.ratio,
            ratio_low=self.ratio_low,
            ratio_high=self.ratio_high,
            repeats=self.repeats,
            stable=self.stable,
            under_load=self.load.loaded,
            others_cores=None if self.load.others_cores is None else round(self.load.others_cores, 2),
            load_per_core=None if self.load.load_per_core is None else round(self.load.load_per_core, 2),
            cores=self.load.cores,
        )


class LoadMeter:
    """Other processes' CPU time over this process's cores between ``start`` and ``stop``. The sources are
    injectable for tests: the stat file, the cores, the wall clock and this process's CPU clock."""

    def __init__(
        self,
        stat: Path = STAT,
        cores: int | None = None,
        wall: Callable[[], float] = time.monotonic,
        own_cpu: Callable[[], float] = time.process_time,
        cpus: set[int] | None = None,
    ) -> None:
        self.stat = stat
        self.cores = cores if cores is not None else cores_allowed()
        self.wall = wall
        self.own_cpu = own_cpu
        self.cpus = cpus  # the CPU numbers whose lines count (None: this process's affinity)
        self._busy0: float | None = None
        self._own0 = 0.0
        self._wall0 = 0.0

    def _busy_s(self) -> float | None:
        """Busy seconds of this process's cores since boot (all but idle and iowait), or None."""
        try:
            lines = self.stat.read_text().splitlines()
        except OSError:
            return None
        try:
            numbers = self.cpus if self.cpus is not None else os.sched_getaffinity(0)
            mine = {f"cpu{n}" for n in numbers}
        except AttributeError:  # no affinity on this platform: the machine's total line
            mine = set()
        ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        busy = 0
        seen = False
        for line in lines:
            name, _, rest = line.partition(" ")
            if (mine and name in mine) or (not mine and name == "cpu"):
                fields = [int(v) for v in rest.split()]
                idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
                busy += sum(fields[:8]) - idle  # user .. steal; guest is counted inside user already
                seen = True
        return busy / ticks if seen else None

    def start(self) -> None:
        self._busy0 = self._busy_s()
        self._own0 = self.own_cpu()
        self._wall0 = self.wall()

    def stop(self) -> MachineLoad:
        wall = self.wall() - self._wall0
        busy1 = self._busy_s()
        own = self.own_cpu() - self._own0
        others: float | None = None
        if self._busy0 is not None and busy1 is not None and wall > 0.05:
            others = min(float(self.cores), max(0.0, (busy1 - self._busy0 - own) / wall))
        try:
            per_core: float | None = os.getloadavg()[0] / max(self.cores, 1)
        except (AttributeError, OSError):
            per_core = None
        return MachineLoad(others_cores=others, load_per_core=per_core, cores=self.cores)


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(lower quartile, median, upper quartile), inclusive of the extremes (three values are enough)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    low, mid, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, mid, high


def time_pair(
    first: Callable[[], object],
    second: Callable[[], object],
    *,
    sync: Callable[[], object] | None = None,
    cpu_bound: bool = True,
    clock: Callable[[], float] = time.perf_counter,
    meter: LoadMeter | None = None,
    target_spread: float = TARGET_SPREAD,
    min_pairs: int = MIN_PAIRS,
    max_pairs: int = MAX_PAIRS,
    max_seconds: float = MAX_SECONDS,
    warmup: int = WARMUP,
) -> PairTiming:
    """Time ``first`` against ``second`` in interleaved pairs until their ratio is stable or time is up.
    ``sync`` waits for the device (CUDA) before and after each run; ``cpu_bound`` says the machine's load
    bears on the paths' speed (a CPU timing). Raises what the paths raise."""
    meter = meter if meter is not None else LoadMeter()
    floor = min(FLOOR_PAIRS, max_pairs)

    def run(path: Callable[[], object]) -> float:
        if sync is not None:
            sync()
        t0 = clock()
        path()
        if sync is not None:
            sync()
        return clock() - t0

    for _ in range(warmup):
        run(first)
        run(second)
    meter.start()
    started = clock()
    firsts: list[float] = []
    seconds: list[float] = []
    ratios: list[float] = []
    tight = False
    while len(ratios) < max_pairs:
        if len(ratios) % 2 == 0:
            a = run(first)
            b = run(second)
        else:
            b = run(second)
            a = run(first)
        firsts.append(a)
        seconds.append(b)
        ratios.append(a / b if b > 0 else float("inf"))
        if len(ratios) >= min(min_pairs, max_pairs):
            low, mid, high = quartiles(ratios)
            tight = mid > 0 and (high - low) / mid <= target_spread
            if tight:
                break
        if len(ratios) >= floor and clock() - started > max_seconds:
            break
    load = meter.stop()
    low, mid, high = quartiles(ratios)
    if len(ratios) < min(min_pairs, max_pairs):  # stopped by the time cap before the spread was judged
        tight = False
    loaded = cpu_bound and load.loaded
    stable = tight and not loaded
    if not stable:  # a timing that did not settle reports all it saw: its quartiles swing from run to run
        low, high = min(ratios), max(ratios)
    if loaded:  # other work slows many small parallel ops more than one fused one: no gain is not ruled out
        low = min(low, 1.0)
    return PairTiming(
        first_s=statistics.median(firsts),
        second_s=statistics.median(seconds),
        ratio=mid,
        ratio_low=low,
        ratio_high=high,
        repeats=len(ratios),
        stable=stable,
        load=load,
    )


def combined(parts: list[tuple[PairTiming, float]]) -> TimingSpread | None:
    """One spread for a sum of compared paths (each timed in pairs, counted ``n`` times: the layers of each
    shape, forward and backward): the ratio and its range weighted by each part's second-path seconds × n,
    so the sum's ratio is Σ n·second·ratio / Σ n·second; the fewest pairs; stable only if every part was; under
    load if any part was (its range then reaches ×1, as one comparison's does)."""
    weighted = [(t, n * t.second_s) for t, n in parts if n > 0]
    total = sum(w for _, w in weighted)
    if not weighted or total <= 0:
        return None
    loads = [t.load for t, _ in weighted]
    others = [load.others_cores for load in loads if load.others_cores is not None]
    per_core = [load.load_per_core for load in loads if load.load_per_core is not None]
    under_load = any(load.loaded for load in loads)
    low = sum(t.ratio_low * w for t, w in weighted) / total
    return TimingSpread(
        ratio=sum(t.ratio * w for t, w in weighted) / total,
        ratio_low=min(low, 1.0) if under_load else low,  # a part timed under load: no gain not ruled out
        ratio_high=sum(t.ratio_high * w for t, w in weighted) / total,
        repeats=min(t.repeats for t, _ in weighted),
        stable=all(t.stable for t, _ in weighted),
        under_load=under_load,
        others_cores=round(max(others), 2) if others else None,
        load_per_core=round(max(per_core), 2) if per_core else None,
        cores=loads[0].cores,
    )
