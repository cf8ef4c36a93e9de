"""The parts of ``pitstop watch`` around the analysis: the rank-file follower (both formats, read while being
written), the plain and live views, the whole-run section of the HTML report and of the JSON document, and
bad input as one line."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from tests.conftest import run_pitstop
from tests.unit.test_wholerun import series

from pitstop.core.profile import Environment, RankProfile, RunProfile, to_jsonable
from pitstop.diagnose import diagnose
from pitstop.diagnose.document import read_run
from pitstop.report.html import render_html
from pitstop.runner.follow import RankFollower
from pitstop.wholerun.run import WholeRun
from pitstop.wholerun.windows import WindowSpec


def _line(kind: str, **payload: object) -> str:
    return json.dumps({"kind": kind, **payload}) + "\n"


def test_the_follower_tails_json_lines_as_they_are_written(tmp_path: Path) -> None:
    steps = series(12)
    path = tmp_path / "rank-4242.jsonl"
    with path.open("w") as f:
        f.write(_line("start", rank=1, pid=4242, warmup=2))
        f.write(_line("environment", rank=1, environment=to_jsonable(Environment(device="cpu"))))
        for s in steps[:5]:
            f.write(_line("step", step=to_jsonable(s), t=0.1 * s.index))
        f.write(_line("step", step=to_jsonable(steps[5]), t=0.6)[:20])  # a line still being written
    follower = RankFollower(tmp_path)
    (news,) = follower.poll()
    assert news.rank == 1 and news.environment is not None and news.environment.device == "cpu"
    assert [s.index for s in news.steps] == [3, 4, 5]  # the warm-up's steps are not handed over
    with path.open("a") as f:
        f.write(_line("step", step=to_jsonable(steps[5]), t=0.6)[20:])
        f.write(_line("gpu", samples=[{"t": 0.5, "util": 97.0}]))
    (news,) = follower.poll()
    assert [s.index for s in news.steps] == [6] and news.gpu[0].util == 97.0
    assert follower.poll() == []  # nothing new: nothing handed over twice


def _report() -> tuple[WholeRun, dict[str, object]]:
    run = WholeRun(WindowSpec(steps=50))
    records = series(400, slow_after=170, eval_every=60)
    run.add(0, records, Environment(device="cpu"))
    _, report = run.finish()
    profile = RunProfile(
        source="watch", ranks=[RankProfile(steps=records, environment=Environment(device="cpu"))]
    )
    return run, diagnose(profile).to_dict() | {"watch": report.to_dict()}


def test_the_document_carries_the_whole_run_and_reads_back() -> None:
    _, doc = _report()
    back = json.loads(json.dumps(doc, default=str))
    w = back["watch"]
    assert set(w) == {
        "window",
        "steps",
        "seconds",
        "windows",
        "changes",
        "periodic_stalls",
        "phases",
        "series",
        "noise_hides_drops_below",
    }
    assert w["noise_hides_drops_below"] is None  # a change was seen: the run was not called steady
    assert [c["kind"] for c in w["changes"]][:1] == ["slower"] and w["periodic_stalls"][0]["period"] == 60
    assert read_run(back).findings  # a reader of pitstop.run/1 takes the document as before


def test_the_html_report_has_the_whole_run_section() -> None:
    _, doc = _report()
    page = render_html(json.loads(json.dumps(doc, default=str)))
    assert 'data-section="watch"' in page and 'data-plot="watch-rate"' in page
    assert 'data-plot="watch-breakdown"' in page and "every 60 steps" in page and "tokens/s fell" in page


def test_the_plain_view_appends_lines() -> None:
    from pitstop.cli.live import PlainView

    run = WholeRun(WindowSpec(steps=50))
    events = run.add(0, series(400, slow_after=170), Environment(device="cpu"))
    stream = io.StringIO()
    PlainView(stream).events(events)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 10  # 8 windows, the slowdown and the finding that came with it
    assert lines[0].startswith("pitstop watch: steps 1–50, ") and "tokens/s" in lines[0]
    assert any(line.startswith("pitstop watch: CHANGE (slower) from step 17") for line in lines)
    assert any(line.startswith("pitstop watch: CHANGE (new_finding) from step 17") for line in lines)


def test_a_change_found_once_the_run_ended_does_not_show_its_window_twice() -> None:
    """The run's last window closed (and was shown) while the job ran; the slowdown it showed is reported at
    the end, unconfirmed. Its window line was printed a second time (a busy machine's doctor run printed
    six lines for five windows), counted twice in the rate over the run, and logged twice to trackers."""
    from pitstop.cli.live import PlainView
    from pitstop.report.live import PanelState

    run = WholeRun(WindowSpec(steps=50))
    while_running = run.add(0, series(400, slow_after=360), Environment(device="cpu"))
    at_the_end, _ = run.finish()
    stream = io.StringIO()
    PlainView(stream).events(while_running + at_the_end)
    windows = [line for line in stream.getvalue().splitlines() if " CHANGE " not in line]
    assert len(while_running) == 8 and len(windows) == 8 and len(set(windows)) == 8
    assert "no later window to confirm it" in stream.getvalue()
    once, twice = PanelState(), PanelState()
    once.take(while_running)
    twice.take(while_running + at_the_end)
    assert twice._seconds == once._seconds and twice.latest_change is not None


def test_the_live_panel_shows_the_run_so_far() -> None:
    from pitstop.cli.live import LiveView

    console = Console(file=io.StringIO(), force_terminal=True, width=120, record=True)
    view = LiveView(console)
    view.step(7)
    run = WholeRun(WindowSpec(steps=50))
    view.events(run.add(0, series(400, slow_after=170), Environment(device="cpu")))
    view.job_output("epoch 1 loss 2.31\n")
    view.close()
    text = console.export_text()
    assert "pitstop watch" in text and "over the run" in text and "top finding" in text
    assert "dataloader_bound" in text and "CHANGE (slower)" in text and "epoch 1 loss 2.31" in text


@pytest.mark.slow
def test_bad_input_is_one_line() -> None:
    proc = run_pitstop("watch", "--report-to", "comet", "--", "python", "-c", "pass")
    assert proc.returncode == 2 and "unknown tracker 'comet'" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = run_pitstop("watch")
    assert proc.returncode == 2 and "no command given" in proc.stderr


def test_the_doctor_views_say_doctor_and_over_the_window() -> None:
    from pitstop.cli.live import LiveView, PlainView
    from pitstop.report.live import small_window_steps as live_window_steps

    events = WholeRun(WindowSpec(steps=10)).add(0, series(50), Environment(device="cpu"))
    stream = io.StringIO()
    PlainView(stream, command="doctor").events(events)
    assert stream.getvalue().startswith("pitstop doctor: steps 1–10, ")
    console = Console(file=io.StringIO(), force_terminal=True, width=120, record=True)
    view = LiveView(console, command="doctor", overall="over the window")
    view.events(events)
    view.close()
    text = console.export_text()
    assert "pitstop doctor" in text and "over the window" in text and "over the run" not in text
    assert live_window_steps(50) == 10 and live_window_steps(None) == 10 and live_window_steps(8) == 4
