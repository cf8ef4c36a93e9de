"""Results computed once: every renderer reads the same Diagnosis, shows the same rank and the same numbers,
and a saved document (new or old) reads back into that Diagnosis."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from rich.console import Console
from tests.factories import profile, steps

from pitstop.core.profile import GpuSample, RankProfile, RunProfile
from pitstop.diagnose import Diagnosis, diagnose
from pitstop.diagnose.document import RunDocumentError, read_run
from pitstop.diagnose.metrics import Metrics
from pitstop.report.html import render_html
from pitstop.report.html.svg import nice_ticks, stacked_bars
from pitstop.report.terminal import render

SLOW = 7  # the rank whose steps take longest


def _ranks(n: int = 12) -> RunProfile:
    """n ranks listed in string order (0, 1, 10, 11, 2, …); rank SLOW is slower and its tokens/s vary."""
    p = profile("cuda", steps(20, wall=0.1, real_frac=0.75), util=90.0, ranks=n)
    p.ranks.sort(key=lambda r: str(r.rank))
    for rank in p.ranks:
        rank.environment.world_size = n
        rank.steps = [dataclasses.replace(s) for s in rank.steps]
        rank.window_start_t = 0.0
        rank.window_end_t = 2.0
        if rank.rank == SLOW:
            for i, s in enumerate(rank.steps):
                s.wall_s = 0.12 + 0.01 * (i % 4)
    return p


def _terminal(d: Diagnosis) -> str:
    console = Console(record=True, width=220, color_system=None)
    render(d, console)
    return console.export_text()


def _tensorboard(d: Diagnosis, tmp_path: Path) -> dict[int, dict[str, list[tuple[int, float]]]]:
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    from pitstop.report.tensorboard import export_tensorboard

    folder = export_tensorboard(d, tmp_path).path
    out = {}
    for rank in (0, SLOW):
        acc = ea.EventAccumulator(str(folder if rank == 0 else folder / f"rank{rank}"), {ea.SCALARS: 0})
        acc.Reload()
        out[rank] = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
    return out


def test_terminal_html_and_tensorboard_show_the_same_rank_and_figures(tmp_path: Path) -> None:
    d = diagnose(_ranks())
    assert d.results.shown.rank == SLOW and "slowest" in d.results.shown.why
    series = d.results.shown_series
    assert series is not None
    rates = [r for r in series.real_tokens_per_s if r is not None]
    headline = f"{d.metrics.real_tokens_per_s:,.0f}"
    per_step = f"{min(rates):,.0f}–{max(rates):,.0f}"

    text = _terminal(d)
    assert f"{headline} real tokens/s" in text
    assert f"{per_step} real tokens/s per step (rank {SLOW}: the slowest rank" in text

    html = render_html(d)
    assert f">{headline}<" in html
    assert f"Tokens per second, step by step (rank {SLOW}: the slowest rank" in html
    assert f"Where each step&#x27;s time goes (rank {SLOW}: the slowest rank" in html

    saved = render_html(d.to_dict())  # the saved document draws the same page
    assert saved.count(f"rank {SLOW}: the slowest rank") == html.count(f"rank {SLOW}: the slowest rank")

    tb = _tensorboard(d, tmp_path)
    (summary,) = tb[0]["pitstop/summary/real_tokens_per_s"]
    assert f"{summary[1]:,.0f}" == headline
    shown = [v for _, v in tb[SLOW]["pitstop/real_tokens_per_s"]]
    assert f"{min(shown):,.0f}–{max(shown):,.0f}" == per_step
    assert [s for s, _ in tb[SLOW]["pitstop/real_tokens_per_s"]] == series.steps


def test_per_rank_rows_are_in_numeric_order() -> None:
    d = diagnose(_ranks())
    assert [r.rank for r in d.results.ranks] == list(range(12))
    assert [r["rank"] for r in d.to_dict()["ranks"]] == list(range(12))
    table = _terminal(d).split("Per rank", 1)[1]
    firsts = [int(m.group(1)) for m in re.finditer(r"^\s*(\d+) │\s+20 │", table, re.MULTILINE)]
    assert firsts == list(range(12))


def test_a_saved_document_reads_back_into_the_same_diagnosis() -> None:
    d = diagnose(_ranks(3))
    back = read_run(d.to_dict())
    assert back.metrics == d.metrics
    assert back.results == d.results
    assert [f.to_dict() for f in back.findings] == [f.to_dict() for f in d.findings]
    assert back.notes == d.notes and back.skipped_checks == d.skipped_checks


def test_an_older_document_without_the_new_keys_reads_back() -> None:
    d = diagnose(_ranks(3))
    old = d.to_dict()
    for key in ("step_series", "gpu_windows", "shown_rank"):
        del old[key]
    added = [f.name for f in dataclasses.fields(Metrics) if f.default is not dataclasses.MISSING]
    for name in added:  # written before these metrics existed
        del old["metrics"][name]
    old["metrics"]["step_time_s"] = 9.99  # what the document says stands, even if the profile says else
    back = read_run(old)
    assert back.results == d.results  # computed from the saved profile, by the same functions
    assert back.metrics.throughput_spread == d.metrics.throughput_spread
    assert back.metrics.gpu_util_active == pytest.approx(0.9)
    assert back.metrics.step_time_s == 9.99


def test_a_document_without_its_profile_still_renders() -> None:
    doc = diagnose(_ranks(2)).to_dict()
    for key in ("profile", "step_series", "gpu_windows", "shown_rank", "ranks"):
        del doc[key]
    html = render_html(doc)
    assert 'data-section="verdict"' in html and f"{doc['metrics']['real_tokens_per_s']:,.0f}" in html


def test_damaged_documents_are_one_line_errors() -> None:
    doc = diagnose(_ranks(2)).to_dict()
    doc["findings"][0]["cause"] = "no_such_cause"
    with pytest.raises(RunDocumentError, match="unknown cause 'no_such_cause'"):
        read_run(doc)
    with pytest.raises(RunDocumentError, match=r"not a pitstop\.run/1"):
        read_run({"schema": "pitstop.plan/1"})


def test_step_axes_have_whole_steps_only() -> None:
    assert nice_ticks(12, integer=True) == [0, 5, 10, 15]
    assert nice_ticks(3, integer=True) == [0, 1, 2, 3]
    svg = stacked_bars("s", "t", {"a": [1.0] * 12}, "optimizer step", "ms", first_x=6)
    ticks = re.findall(r'class="tick"[^>]*text-anchor="middle">([^<]+)<', svg)
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_environment_table_says_off_for_an_empty_offload() -> None:
    html = render_html(diagnose(profile("cuda", steps(), util=90.0)).to_dict())
    row = re.search(r"<td[^>]*>offload</td><td[^>]*>([^<]*)</td>", html)
    assert row is not None and row.group(1) == "off"


def test_a_log_without_a_gpu_name_says_how_to_name_it() -> None:
    rank = RankProfile(rank=0, gpu_samples=[GpuSample(t=float(i), util=40.0) for i in range(60)])
    rank.environment.device = "cuda"
    text = _terminal(diagnose(RunProfile(source="analyze", ranks=[rank])))
    expected = text.split("Expected", 1)[1].split("Seen", 1)[0]
    assert "'None'" not in expected
    assert "does not name the GPU model" in expected and "--gpu" in expected
