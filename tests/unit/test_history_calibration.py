"""Predicted against measured, read back from the history: ``pitstop history calibration`` and a later
diagnosis of the same job corrected by what tune measured on it (issue 27 item 3)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import typer
from tests.factories import profile, steps
from typer.testing import CliRunner

from pitstop.cli.doctor import _with_calibration
from pitstop.cli.history import history_app
from pitstop.cli.outputs import Outputs
from pitstop.diagnose import Diagnosis, diagnose
from pitstop.history import open_store, record
from pitstop.history.calibration import calibrations, corrected

app = typer.Typer()
app.add_typer(history_app, name="history")


def padded(row_len: int = 512) -> Diagnosis:
    return diagnose(profile("cpu", steps(wall=0.1, data=0.0, real_frac=0.5, row_len=row_len)))


def tune_doc(baseline: dict[str, Any], pairs: list[dict[str, Any]]) -> dict[str, Any]:
    base = baseline["metrics"]["real_tokens_per_s"]
    return {
        "schema": "pitstop.tune/1",
        "baseline": {"real_tokens_per_s": base, "spread": 0.01},
        "best": {"fix": "pack_batch", "real_tokens_per_s": base * 1.5, "speedup": 1.5, "kept": True},
        "baseline_run": baseline,
        "predicted_vs_measured": pairs,
    }


PAIRS = [
    {"cause": "padding_waste", "fix": "pack_batch", "predicted": 2.0, "measured": 1.5, "status": "kept"},
    {
        "cause": "padding_waste",
        "fix": "trim_padding",
        "predicted": 2.0,
        "measured": 1.2,
        "status": "undecided",
    },
    {
        "cause": "padding_waste",
        "fix": "pack",
        "predicted": "2",
        "measured": None,
        "status": "kept",
    },  # damaged
    {
        "cause": "dataloader_bound",
        "fix": "workers",
        "predicted": 1.1,
        "measured": 1.21,
        "status": "within noise",
    },
]


@pytest.fixture
def tuned(history_file: Path) -> Diagnosis:
    """One tune run of the padded job in the history; returns a fresh diagnosis of the same job."""
    record(tune_doc(padded().to_dict(), PAIRS), "tune")
    return padded()


def test_pairs_per_cause_with_their_factor_and_error(tuned: Diagnosis, history_file: Path) -> None:
    with open_store(history_file) as store:
        known = {c.cause: c for c in calibrations(store)}
    assert set(known) == {"padding_waste", "dataloader_bound"}  # undecided and damaged rows calibrate nothing
    padding = known["padding_waste"]
    assert len(padding.pairs) == 1 and padding.factor == pytest.approx(0.75)
    assert padding.error == pytest.approx(math.log(2.0 / 1.5))
    assert known["dataloader_bound"].factor == pytest.approx(1.1)


def test_a_later_diagnosis_of_the_same_job_is_corrected_and_says_so(
    tuned: Diagnosis, history_file: Path
) -> None:
    before = {f.cause: f for f in tuned.findings}["padding_waste"].est_speedup
    assert before is not None and before > 1.0
    after = _with_calibration(tuned, Outputs(history=history_file, record=True))
    finding = {f.cause: f for f in after.findings}["padding_waste"]
    assert finding.est_speedup == pytest.approx(max(1.0, before * 0.75))
    assert "corrected ×0.75 by what tune measured on this job (1 measurement, history run #1)" in (
        finding.speedup_basis
    )
    assert any(n.startswith("padding_waste: estimate corrected ×0.75") for n in after.notes)


def test_another_job_is_not_corrected(tuned: Diagnosis, history_file: Path) -> None:
    other = padded(row_len=2048)  # another sequence length: another fingerprint
    est = {f.cause: f.est_speedup for f in other.findings}
    after = _with_calibration(other, Outputs(history=history_file, record=True))
    assert {f.cause: f.est_speedup for f in after.findings} == est and not after.notes
    unrecorded = _with_calibration(padded(), Outputs(history=history_file, record=False))
    assert not unrecorded.notes  # --no-history reads nothing either


def test_corrected_findings_are_ranked_again() -> None:
    findings = padded().findings
    from pitstop.history.calibration import CauseCalibration, Pair

    shrink = CauseCalibration("padding_waste", (Pair(1, "padding_waste", "pack", 10.0, 1.0),))
    out, notes = corrected(findings, [shrink])
    padding = next(f for f in out if f.cause == "padding_waste")
    assert padding.est_speedup is not None and padding.est_speedup >= 1.0 and len(notes) == 1
    assert [f.cause for f in out] == [f.cause for f in sorted(out, key=lambda f: -f.expected_saving)]


def test_the_command_prints_the_table_and_json(tuned: Diagnosis) -> None:
    runner = CliRunner()
    text = runner.invoke(app, ["history", "calibration"], env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    assert (
        "padding_waste" in text.stdout
        and "×2.00→×1.50 (pack_batch)" in text.stdout
        and "×0.75" in text.stdout
    )
    doc = json.loads(runner.invoke(app, ["history", "calibration", "--json"]).stdout)
    assert {c["cause"]: c["measured_over_predicted"] for c in doc} == {
        "dataloader_bound": 1.1,
        "padding_waste": 0.75,
    }


def test_an_empty_history_says_what_to_run(history_file: Path) -> None:
    result = CliRunner().invoke(app, ["history", "calibration"])
    assert result.exit_code == 0 and "run `pitstop tune` first" in result.stdout
