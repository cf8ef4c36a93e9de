"""The terminal report's inline pictures: the sparkline function, and where render shows it."""

from __future__ import annotations

import math

from rich.console import Console
from tests.factories import profile, steps

from pitstop.core.profile import GpuSample, RunProfile
from pitstop.diagnose import diagnose
from pitstop.report.terminal import SPARK_BLOCKS, render, sparkline


def test_empty_gives_nothing() -> None:
    assert sparkline([]) == ""
    assert sparkline([None, float("nan")]) == ""


def test_constant_draws_flat_at_mid_height() -> None:
    assert sparkline([5.0] * 7) == SPARK_BLOCKS[3] * 7
    assert sparkline([100.0] * 4, lo=0.0, hi=100.0) == "████"  # on a fixed scale: where it is


def test_monotone_spans_the_blocks() -> None:
    assert sparkline([float(i) for i in range(8)]) == SPARK_BLOCKS
    assert sparkline([float(i) for i in range(7, -1, -1)]) == SPARK_BLOCKS[::-1]
    assert sparkline([0.0, 100.0], lo=0.0, hi=100.0) == "▁█"
    assert sparkline([-5.0, 150.0], lo=0.0, hi=100.0) == "▁█"  # clamped to the scale


def test_none_and_nan_are_skipped() -> None:
    assert sparkline([0.0, None, math.nan, 7.0, math.inf]) == "▁█"


def test_long_series_are_averaged_into_buckets() -> None:
    values = [float(i % 2) * 100 for i in range(1200)]  # alternating: every bucket of 20 averages to 50
    line = sparkline(values, 60, lo=0.0, hi=100.0)
    assert len(line) == 60
    assert len(set(line)) == 1 and line[0] in SPARK_BLOCKS[3:5]  # mid height, not the extremes
    assert len(sparkline([float(i) for i in range(61)], 60)) == 60
    assert len(sparkline([float(i) for i in range(10)], 60)) == 10  # short series are not stretched
    assert sparkline([0.0] * 500 + [1.0] * 500, 10) == SPARK_BLOCKS[0] * 5 + SPARK_BLOCKS[-1] * 5


def _text(p: RunProfile) -> str:
    console = Console(record=True, width=120)
    render(diagnose(p), console)
    return console.export_text()


def _line(text: str, label: str) -> str:
    (line,) = [ln for ln in text.splitlines() if f"│ {label}" in ln]
    return line


def test_gpu_run_shows_both_pictures() -> None:
    p = profile("cuda", steps(200), util=80.0)
    rank = p.ranks[0]
    rank.gpu_samples = [GpuSample(t=0.05 * i, util=float(i % 101)) for i in range(400)]
    rank.window_start_t, rank.window_end_t = 0.0, 10.0  # samples at t > 10 s (after the window) are left out
    text = _text(p)
    util = _line(text, "GPU util")
    assert "min 0% · mean 50% · max 100%" in util
    spark = util.split("│ GPU util")[1].split()[0]
    assert len(spark) == 60 and set(spark) <= set(SPARK_BLOCKS)
    tokens = _line(text, "Tokens/s")
    assert "81,920–81,920 real tokens/s" in tokens
    assert "█" * 60 in tokens  # a steady run: every step at the top of a scale that starts at zero
    assert "Step time" in text  # the breakdown bar stays


def test_cpu_run_has_no_gpu_picture() -> None:
    text = _text(profile("cpu"))
    assert "GPU util" not in text
    tokens = _line(text, "Tokens/s")
    assert "█" * 20 in tokens  # 20 steps: one character each
    assert "Step time" in text
