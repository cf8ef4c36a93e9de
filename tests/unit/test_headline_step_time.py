"""The report's header and its findings quote one step time: the header's s/step is the mean step (labelled,
beside the median) and a finding's "of the N ms step" is that same mean (issue 42: 2.182 s against 2269 ms)."""

from __future__ import annotations

import io
import re

from rich.console import Console
from tests.factories import profile, steps

from pitstop.core.profile import AttentionInfo, AttentionTiming
from pitstop.diagnose import diagnose
from pitstop.report.terminal import render


def _skewed_eager_run() -> str:
    """Steps of 2.0 s with a few slow ones (mean 2.27 s, median 2.0 s), eager attention timed after the
    window: the rendered report."""
    records = steps(n=20, wall=2.0, rows=8, row_len=384)
    for slow in records[:3]:
        slow.wall_s = 3.8  # three slow steps pull the mean up, not the median
        slow.backward_s = (slow.backward_s or 0.0) + 1.8
    p = profile("cpu", records, attention=AttentionInfo(implementation="eager", sdpa_calls=0))
    p.ranks[0].attention_timing = AttentionTiming(
        eager_s=0.032, fused_s=0.021, rows=8, heads=2, seq=384, head_dim=32, dtype="float32", rows_timed=8
    )
    console = Console(file=io.StringIO(), width=200, color_system=None)
    render(diagnose(p), console)
    out = console.file.getvalue()
    assert isinstance(out, str)
    return out


def test_the_header_s_per_step_is_the_step_time_a_finding_quotes() -> None:
    report = _skewed_eager_run()
    header = re.search(r"([\d.]+) s/step mean, ([\d.]+) median", report)
    assert header is not None, report
    mean_s, median_s = float(header[1]), float(header[2])
    assert median_s == 2.0 and mean_s == round((17 * 2.0 + 3 * 3.8) / 20, 3)  # both, each labelled
    quoted = re.findall(r"of the (\d+) ms step", report.replace("\n", " "))
    assert quoted, report  # slow_attention's basis: "... ms of the N ms step"
    assert {int(q) for q in quoted} == {round(mean_s * 1000)}


def test_steady_steps_show_one_number_twice_each_labelled() -> None:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    render(diagnose(profile("cpu", steps(n=5, wall=0.5))), console)
    out = console.file.getvalue()
    assert isinstance(out, str)
    assert "0.500 s/step mean, 0.500 median" in out
