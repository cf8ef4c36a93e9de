"""The HTML report renders every kind of saved result, escapes what the run wrote, and refuses the rest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.conftest import run_pitstop
from tests.factories import profile, steps

from pitstop.diagnose import diagnose
from pitstop.report.html import ReportError, render_html
from pitstop.report.html.svg import bucket, nice_ticks


def test_run_report_has_every_section_and_no_outside_reference() -> None:
    doc = diagnose(profile("cuda", steps(real_frac=0.5), util=40.0)).to_dict()
    html = render_html(doc)
    for key in ("verdict", "findings", "plots", "environment"):
        assert f'data-section="{key}"' in html
    for plot in ("step-breakdown", "step-breakdown-mean", "tokens-per-step", "gpu-timeline", "pcie-timeline"):
        assert f'data-plot="{plot}"' in html
    assert "http://" not in html and "https://" not in html and "<link" not in html and " src=" not in html


def test_what_the_run_wrote_is_escaped() -> None:
    doc = diagnose(profile("cpu", steps(real_frac=0.5))).to_dict()
    doc["command"] = ["python", "<script>alert(1)</script>"]
    doc["findings"][0]["summary"] = "<img src=x onerror=alert(1)>"
    html = render_html(doc)
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;" in html
    assert "<img src=x" not in html


def test_tune_and_history_documents_render() -> None:
    run = diagnose(profile("cpu")).to_dict()
    tune = {
        "schema": "pitstop.tune/1",
        "command": ["python", "train.py"],
        "baseline": {"real_tokens_per_s": 1000.0, "spread": 0.02, "drift": 0.01},
        "candidates": [
            {"fix": "pack", "title": "pack", "preserves_computation": False, "real_tokens_per_s": 2100.0,
             "speedup": 2.1, "spread": 0.03, "window_spread": 0.01, "kept": True, "status": "kept", "reason": "+110%"},
            {"fix": "workers", "title": "workers", "preserves_computation": True, "real_tokens_per_s": None,
             "speedup": None, "spread": None, "kept": False, "status": "failed", "reason": "RuntimeError: x"},
        ],
        "best": {"fixes": ["pack"], "real_tokens_per_s": 2100.0, "speedup": 2.1, "spread": 0.03,
                 "verified": True, "changes": [{"fix": "pack", "text": "Pack.", "snippet": "collate = ..."}]},
        "notes": ["a note"],
        "baseline_run": run,
    }  # fmt: skip
    html = render_html(tune)
    assert 'data-plot="tune-bars"' in html and "RuntimeError: x" in html and "collate = ..." in html
    runs = [
        {"id": i, "created_at": "2026-11-29T10:00:00+00:00", "kind": "doctor", "label": "main",
         "fingerprint": "abc", "real_tokens_per_s": 1000.0 + i, "mfu": None}
        for i in (1, 2, 3)
    ]  # fmt: skip
    for doc in (runs, {"schema": "pitstop.history/1", "runs": runs}):
        html = render_html(doc)
        assert 'data-plot="history-line"' in html and "×1.00" in html


def test_foreign_documents_are_refused() -> None:
    for doc in ({"schema": "something/1"}, [1, 2], "text", {}):
        with pytest.raises(ReportError, match="not a pitstop result"):
            render_html(doc)


def test_long_series_are_bucketed() -> None:
    values, size = bucket(list(range(100_000)), limit=400)
    assert len(values) <= 400 and size == 250 and values[0] == pytest.approx(124.5)
    assert nice_ticks(87) == [0, 20, 40, 60, 80, 100]
    assert nice_ticks(0) == [0.0, 1.0]


@pytest.mark.slow
def test_report_cli_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"schema": "other/1"}))
    for args, message in (
        (("report", str(tmp_path / "missing.json"), "--html", str(tmp_path / "r.html")), "no such file"),
        (("report", str(bad), "--html", str(tmp_path / "r.html")), "not JSON"),
        (("report", str(foreign), "--html", str(tmp_path / "r.html")), "not a pitstop result"),
        (("report", str(foreign)), "nothing to do"),
        (("report", str(foreign), "--html", str(tmp_path / "no" / "r.html")), "does not exist"),
    ):
        proc = run_pitstop(*args)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


def test_hand_made_history_cannot_inject_and_damaged_documents_are_refused() -> None:
    runs = [{"id": "<b>1</b>", "fingerprint": "x", "real_tokens_per_s": 1.0, "created_at": ""}]
    assert "<b>1</b>" not in render_html(runs)
    broken = diagnose(profile("cpu")).to_dict()
    broken["findings"] = [{"title": "no cause key"}]
    with pytest.raises(ReportError, match="incomplete or damaged"):
        render_html(broken)


def test_the_page_says_where_tokens_and_steps_were_counted() -> None:
    from pitstop.core.profile import CountSource, StepBoundary

    p = profile("cpu", steps())
    p.ranks[0].tokens_counted_from = CountSource.MODEL_INPUTS
    p.ranks[0].steps_delimited_by = StepBoundary.OPTIMIZER_STEP
    page = render_html(diagnose(p).to_dict())
    assert (
        '<td class="">counted from the model&#x27;s forward inputs (the loop builds its own batches' in page
    )
    assert "· steps: optimizer step</td>" in page
