"""The gpu-check's activity counters (issue 30 item 5), as plain functions so that their logic is tested on a
CPU with recorded inputs (tests/unit/test_gpu_check_activity.py) and run for real by tests/gpu.

What is compared: NVML's GPM SM activity over one window (two GPM samples, one at each end) against the share
of the same window in which a torch.profiler trace shows some kernel running (kernel intervals merged over
streams). SM activity is averaged over the SMs, so it can only be at most the kernel-busy share (a kernel
that fills every SM reads close to it; a small one reads far below); the energy counter's power against the
sampled power draw.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from pitstop.core.profile import ActivitySample, RankProfile
from pitstop.probe.collectors.samplers import GpmReader

SLACK = 0.05  # the window's ends: GPM's samples and the host clock are not taken at the same instant
MIN_RATIO = 0.6  # a workload of large matrix products fills the SMs: SM activity near the kernel-busy share
MIN_BUSY = 0.3  # below this the window mostly waited on the host, and a comparison says little
POWER_TOLERANCE = 0.25  # counter power against the mean sampled power


class GpmUnsupported(Exception):
    """This GPU (or pynvml) has no GPM: the check is skipped, with the reason."""


@dataclass
class GpmWindow:
    metrics: dict[str, float | None]  # GPM's metrics between the window's two samples
    seconds: float  # host time from the first sample to the second
    read_ms: float  # what one GPM sample-and-compute call cost (the probe's overhead per read)
    unsupported: list[str]


def gpm_window(nvml: Any, handle: Any, work: Callable[[], None]) -> GpmWindow:
    """GPM's metrics over ``work`` (which must end with the device synchronized): one sample right before,
    one right after, through the probe's own GpmReader."""
    reader, why = GpmReader.open(nvml, handle)
    if reader is None:
        raise GpmUnsupported(why or "GPM not available")
    try:
        reader.read()  # the window's first sample
        start = time.perf_counter()
        work()
        seconds = time.perf_counter() - start
        before = time.perf_counter()
        metrics = reader.read()
        read_ms = 1000 * (time.perf_counter() - before)
    finally:
        reader.close()
    if metrics is None:
        raise GpmUnsupported("GPM gave no metrics for the window")
    return GpmWindow(metrics, seconds, read_ms, sorted(reader.unsupported))


def kernel_intervals(trace: dict[str, Any]) -> list[tuple[float, float]]:
    """(start, end) in seconds of every GPU kernel in a Chrome trace (torch.profiler's export): complete
    events of category ``kernel`` (memcpy and memset are other engines' work, not the SMs')."""
    out = []
    for event in trace.get("traceEvents") or []:
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        if str(event.get("cat", "")).lower() != "kernel":
            continue
        ts, dur = event.get("ts"), event.get("dur")
        if isinstance(ts, int | float) and isinstance(dur, int | float) and dur > 0:
            out.append((ts / 1e6, (ts + dur) / 1e6))
    return out


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """The time in which at least one kernel ran: the intervals merged over streams."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def busy_share(intervals: list[tuple[float, float]], window_s: float) -> float:
    """The share of a window of ``window_s`` seconds in which some kernel ran (at most 1)."""
    return min(1.0, busy_seconds(intervals) / window_s) if window_s > 0 else 0.0


def sm_agrees(sm_active: float | None, busy: float) -> tuple[bool, str]:
    """Whether GPM's SM activity and the trace's kernel-busy share of the same window agree: SM activity
    never above the busy share (beyond the window's ends), and for SM-filling work not far below it."""
    if sm_active is None:
        return False, "GPM gave no SM activity"
    said = f"SM active {sm_active:.0%} against kernels busy {busy:.0%} of the window"
    if busy < MIN_BUSY:
        return False, f"{said}: the workload kept the GPU too idle to compare"
    if sm_active > busy + SLACK:
        return False, f"{said}: SM activity cannot exceed the time kernels ran"
    if sm_active < MIN_RATIO * busy:
        return False, f"{said}: under {MIN_RATIO:.0%} of it for a workload that fills the SMs"
    return True, said


def in_window(rank: RankProfile) -> list[ActivitySample]:
    """The rank's activity samples taken inside its measured window."""
    act = rank.gpu_activity
    if act is None:
        return []
    start = rank.window_start_t if rank.window_start_t is not None else float("-inf")
    end = rank.window_end_t if rank.window_end_t is not None else float("inf")
    return [s for s in act.samples if start <= s.t <= end]


def mean_of(samples: list[ActivitySample], name: str) -> float | None:
    values = [getattr(s, name) for s in samples if getattr(s, name) is not None]
    return statistics.fmean(values) if values else None


def counter_watts(samples: list[ActivitySample]) -> float | None:
    """Mean power from the energy counter's increases between consecutive samples (J / s), or None."""
    read = [(s.t, s.energy_j) for s in samples if s.energy_j is not None]
    joules = seconds = 0.0
    for (t0, e0), (t1, e1) in pairwise(read):
        if t1 > t0 and e1 >= e0:
            joules, seconds = joules + e1 - e0, seconds + t1 - t0
    return joules / seconds if seconds > 0 else None


def sampled_watts(rank: RankProfile) -> float | None:
    """The mean of NVML's power readings inside the rank's window."""
    start = rank.window_start_t if rank.window_start_t is not None else float("-inf")
    end = rank.window_end_t if rank.window_end_t is not None else float("inf")
    drawn = [s.power_w for s in rank.gpu_samples if s.power_w is not None and start <= s.t <= end]
    return statistics.fmean(drawn) if drawn else None


def power_agrees(counter_w: float | None, sampled_w: float | None) -> tuple[bool, str]:
    """Whether the energy counter's power and the sampled power draw agree within POWER_TOLERANCE."""
    if counter_w is None:
        return False, "the energy counter gave no increase over the window"
    if sampled_w is None:
        return False, "no power samples to compare with"
    ratio = counter_w / sampled_w if sampled_w > 0 else float("inf")
    said = f"counter {counter_w:,.0f} W against sampled {sampled_w:,.0f} W (×{ratio:.2f})"
    if abs(ratio - 1.0) > POWER_TOLERANCE:
        return False, f"{said}: more than {POWER_TOLERANCE:.0%} apart"
    return True, said
