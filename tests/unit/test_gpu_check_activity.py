"""The gpu-check's activity checks (issue 30 item 5) on a CPU, with recorded inputs: GPM over one window through
a stand-in with the shapes of pynvml's GPM structures, kernel intervals from a torch.profiler Chrome trace,
the SM-activity-against-kernel-busy verdict, the energy counter against the power samples, and the table
bench/gpu_check.py prints (skipping cleanly without CUDA)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tests.gpu.activity import (
    MIN_RATIO,
    GpmUnsupported,
    busy_seconds,
    busy_share,
    counter_watts,
    gpm_window,
    in_window,
    kernel_intervals,
    mean_of,
    power_agrees,
    sampled_watts,
    sm_agrees,
)
from tests.unit.test_gpu_activity_gpm import StandInGpm

from pitstop.core.profile import ActivitySample, GpuActivity, GpuSample, RankProfile

ROOT = Path(__file__).resolve().parents[2]


def _reading(sm: float, tensor: float, dram: float) -> dict[int, float]:
    return {1: 97.0, 2: sm, 3: 30.0, 5: tensor, 10: dram, 20: 100.0, 21: 50.0}


def test_gpm_over_one_window_through_the_probes_reader() -> None:
    nvml = StandInGpm([_reading(10, 0, 5), _reading(88, 61, 34)], missing=(20,))
    ran: list[bool] = []
    window = gpm_window(nvml, "gpu0", lambda: ran.append(True))
    assert ran == [True] and nvml.taken == 2  # one sample before the work, one after
    m = window.metrics
    assert m["sm_active"] == pytest.approx(0.88) and m["tensor_active"] == pytest.approx(0.61)
    assert m["dram_active"] == pytest.approx(0.34) and m["pcie_tx"] is None
    assert window.unsupported == ["pcie_tx"] and window.seconds >= 0 and window.read_ms >= 0
    assert nvml.freed == 2


def test_a_gpu_without_gpm_is_a_skip_with_its_reason() -> None:
    with pytest.raises(GpmUnsupported, match="not supported"):
        gpm_window(StandInGpm([_reading(1, 1, 1)], supported=0), "gpu0", lambda: None)


TRACE = {  # torch.profiler's export_chrome_trace layout: µs timestamps, one stream per "tid"
    "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm", "ts": 1000, "dur": 4000, "tid": 7},
        {"ph": "X", "cat": "kernel", "name": "elementwise", "ts": 3000, "dur": 3000, "tid": 13},  # overlaps
        {"ph": "X", "cat": "Kernel", "name": "reduce", "ts": 8000, "dur": 1000, "tid": 7},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 9000, "dur": 500, "tid": 7},
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 9500},
        {"ph": "X", "cat": "kernel", "name": "empty", "ts": 9600, "dur": 0},
        "not an event",
    ]
}


def test_kernel_busy_share_merges_streams_and_leaves_copies_out() -> None:
    intervals = kernel_intervals(TRACE)
    assert len(intervals) == 3
    assert busy_seconds(intervals) == pytest.approx(0.006)  # 1–6 ms merged, 8–9 ms
    assert busy_share(intervals, 0.010) == pytest.approx(0.6)
    assert busy_share(intervals, 0.004) == 1.0 and busy_share(intervals, 0.0) == 0.0
    assert kernel_intervals({}) == []


@pytest.mark.parametrize(
    ("sm", "busy", "ok", "words"),
    [
        (0.86, 0.95, True, "SM active 86% against kernels busy 95%"),
        (0.97, 0.95, True, "SM active 97%"),  # within the window's ends
        (0.80, 0.60, False, "cannot exceed"),
        (0.20, 0.95, False, f"under {MIN_RATIO:.0%}"),
        (0.05, 0.10, False, "too idle"),
        (None, 0.95, False, "no SM activity"),
    ],
)
def test_sm_activity_against_the_kernel_busy_share(
    sm: float | None, busy: float, ok: bool, words: str
) -> None:
    agreed, why = sm_agrees(sm, busy)
    assert agreed is ok and words in why


def _rank(energy_mj: list[float], power_w: list[float]) -> RankProfile:
    """A probe window 1–5 s with activity read at 1 Hz (as NvmlSampler's activity_every=10 at 10 Hz), one
    reading before the window and one after it."""
    samples = [
        ActivitySample(t=float(t), energy_j=e / 1000.0, sm_active=0.8 if t else None)
        for t, e in enumerate(energy_mj)
    ]
    return RankProfile(
        window_start_t=1.0,
        window_end_t=5.0,
        gpu_activity=GpuActivity(source="nvml gpm", gpu="0", samples=samples, timed=True),
        gpu_samples=[GpuSample(t=0.5 * i, power_w=p) for i, p in enumerate(power_w)],
    )


def test_energy_counter_power_against_the_power_samples() -> None:
    # the counter rises 650 J a second inside the window (and 10 kJ outside it, which must not count)
    rank = _rank([0, 10_000_000, 10_650_000, 11_300_000, 11_950_000, 12_600_000, 30_000_000], [640.0] * 12)
    samples = in_window(rank)
    assert [s.t for s in samples] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert mean_of(samples, "sm_active") == pytest.approx(0.8)
    assert counter_watts(samples) == pytest.approx(650.0)
    assert sampled_watts(rank) == pytest.approx(640.0)
    ok, why = power_agrees(counter_watts(samples), sampled_watts(rank))
    assert ok and "×1.02" in why
    assert not power_agrees(650.0, 300.0)[0] and not power_agrees(None, 640.0)[0]
    assert not power_agrees(650.0, None)[0]


def test_a_restarted_counter_counts_only_its_increases() -> None:
    samples = [ActivitySample(t=float(t), energy_j=e) for t, e in enumerate([100.0, 700.0, 50.0, 650.0])]
    assert counter_watts(samples) == pytest.approx(600.0)


def _gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


def test_gpu_check_skips_cleanly_without_cuda(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    check = _gpu_check()
    monkeypatch.setattr(check, "cuda_device", lambda: None)
    assert check.main(["activity"]) == 0
    assert capsys.readouterr().out.strip() == "skipped: no CUDA GPU"


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.gpu.test_gpu_activity" name="test_gpm_sm_tensor_and_dram_activity_in_the_probe"/>
<testcase classname="tests.gpu.test_gpu_activity" name="test_energy_counter_against_the_sampled_power">
<skipped message="no energy counter on Tesla P100 (Volta and newer have it)"/></testcase>
<testcase classname="tests.gpu.test_gpu_activity" name="test_sm_activity_against_the_kernel_busy_share_of_a_trace">
<failure message="AssertionError: SM active 20% against kernels busy 95% of the window: under 60% of it">x</failure>
</testcase></testsuite></testsuites>"""


def test_gpu_check_prints_one_row_per_check(tmp_path: Path) -> None:
    check = _gpu_check()
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    rows = check.outcomes(junit)
    measured = {
        "test_gpm_sm_tensor_and_dram_activity_in_the_probe": {"sm_active": 0.87, "tensor_active": 0.55},
        "test_sm_activity_against_the_kernel_busy_share_of_a_trace": {"kernel_busy": 0.95, "sm_active": 0.2},
    }
    lines = check.table(rows, measured)
    assert len(lines) == 4 and lines[0].startswith("check")
    assert "passed" in lines[1] and "sm_active=0.87, tensor_active=0.55" in lines[1]
    assert "skipped" in lines[2] and "no energy counter" in lines[2]
    assert (
        "FAILED" in lines[3] and "kernel_busy=0.95, sm_active=0.2 (AssertionError: SM active 20%" in lines[3]
    )
