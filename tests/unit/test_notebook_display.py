"""Results display themselves in notebooks: the HTML report inside an isolated frame."""

from __future__ import annotations

import html
from typing import Any

from tests.factories import profile, steps

from pitstop.diagnose import diagnose
from pitstop.tune.session import TuneResult


def _srcdoc(frame: str) -> str:
    assert frame.startswith('<iframe srcdoc="') and frame.endswith("</iframe>")
    return html.unescape(frame.split('srcdoc="', 1)[1].split('" title=', 1)[0])


def test_a_diagnosis_shows_its_report() -> None:
    d = diagnose(profile("cpu", steps(real_frac=0.5)))
    page = _srcdoc(d._repr_html_())
    assert "why this run is slow" in page
    assert 'data-section="findings"' in page and d.findings[0].cause in page


def test_a_tune_result_shows_its_report(monkeypatch: Any) -> None:
    run = diagnose(profile("cpu")).to_dict()
    doc = {
        "schema": "pitstop.tune/1",
        "command": ["python", "train.py"],
        "baseline": {"real_tokens_per_s": 1000.0, "spread": 0.02, "drift": 0.01},
        "candidates": [
            {"fix": "pack", "title": "pack", "preserves_computation": False, "real_tokens_per_s": 2100.0,
             "speedup": 2.1, "spread": 0.03, "window_spread": 0.01, "kept": True, "status": "kept", "reason": "+110%"},
        ],
        "best": {"fixes": ["pack"], "real_tokens_per_s": 2100.0, "speedup": 2.1, "spread": 0.03,
                 "verified": True, "changes": [{"fix": "pack", "text": "Pack.", "snippet": "collate = ..."}]},
        "notes": [],
        "baseline_run": run,
    }  # fmt: skip
    result = TuneResult.__new__(
        TuneResult
    )  # a real TuneResult needs tune's windows; its document is what shows
    monkeypatch.setattr(result, "to_dict", lambda: doc, raising=False)
    page = _srcdoc(result._repr_html_())
    assert "pitstop tune: measured on your job" in page and 'data-plot="tune-bars"' in page


def test_a_history_comparison_and_run_list_show_as_tables(tmp_path: Any) -> None:
    from pitstop.history import compare_runs, open_store, record

    fast = diagnose(profile("cpu")).to_dict()
    slow = diagnose(profile("cpu", steps(real_frac=0.5))).to_dict()
    path = tmp_path / "h.sqlite3"
    a, b = record(fast, "doctor", path, label="main"), record(slow, "doctor", path, label="<b>x</b>")
    with open_store(path) as store:
        table = compare_runs(store.get(a), store.get(b))._repr_html_()  # type: ignore[arg-type]
        runs = store.list()._repr_html_()
    assert table.startswith("<table") and "run #1 (main)" in table and "real tokens/s" in table
    assert "&lt;b&gt;x&lt;/b&gt;" in table and "<b>x</b>" not in table  # labels are text, never markup
    assert "pitstop history: 2 runs" in runs and runs.count("<tr>") == 3
