"""Issue 42, item 9: the newcomer's Trainer job (``tests/scripts/newcomer_trainer.py``) dies at step 3 (its
callback raises). ``pitstop doctor`` leads its report with the exit and the exception, confidence follows the 2
steps measured, the history keeps the run as failed and a later successful run does not take it as its
baseline. The probe changes neither the job's exit code nor the traceback it prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pitstop.diagnose import FULL_CONFIDENCE_STEPS
from pitstop.probe.config import ProbeConfig
from pitstop.probe.rankfile import Failed, decode
from pitstop.runner.inject import child_environment, prepare_injection
from tests.conftest import ROOT, run_pitstop

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "tests" / "scripts" / "newcomer_trainer.py"
SMALL = ["--batch", "4", "--max-length", "128"]  # a smaller padded job: the same causes, quicker steps
CRASHING = [sys.executable, str(SCRIPT), "--steps", "40", *SMALL, "--crash-at", "3"]
MESSAGE = "the user's callback failed at step 3"
RAISE_LINE = next(  # the job's own line that raises: where the exception must be placed
    i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1) if "raise RuntimeError(" in text
)


def _traceback_end(stderr: str) -> list[str]:
    """The traceback's innermost frame and its exception line, as the job printed them (its progress bar,
    closed at exit, prints after it)."""
    lines = stderr.splitlines()
    start = max(i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line)
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("RuntimeError:"))
    return lines[end - 3 : end + 1]


def test_the_probe_leaves_the_jobs_exit_and_traceback_as_they_were(tmp_path: Path) -> None:
    plain = subprocess.run(CRASHING, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = tmp_path / "probe"
    out.mkdir()
    env = child_environment(
        ProbeConfig(warmup=10, steps=50, out_dir=out, announce=False), prepare_injection(out)
    )
    probed = subprocess.run(CRASHING, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert plain.returncode == probed.returncode == 1, probed.stderr[-3000:]
    assert _traceback_end(plain.stderr) == _traceback_end(probed.stderr), probed.stderr[-3000:]
    assert _traceback_end(probed.stderr)[-1] == f"RuntimeError: {MESSAGE}"
    assert f'{SCRIPT}", line {RAISE_LINE}' in "\n".join(_traceback_end(probed.stderr))
    assert (
        probed.stderr.count("Traceback (most recent call last)") == 1
    )  # printed once, by the job's own hook
    (rank_file,) = out.glob("rank-*.jsonl")
    failures = [r for r in map(decode, rank_file.read_text().splitlines()) if isinstance(r, Failed)]
    assert len(failures) == 1 and failures[0].failure.step == 3  # written as it was raised


def test_doctor_on_a_crashed_job_leads_with_the_failure_and_history_marks_it(tmp_path: Path) -> None:
    history = tmp_path / "history.sqlite3"
    env = {"PITSTOP_HISTORY": str(history), "COLUMNS": "200"}
    out = tmp_path / "crash.json"
    crashed = run_pitstop("doctor", "--quiet", "--json", str(out), "--", *CRASHING, env=env, timeout=600)
    assert crashed.returncode == 1, crashed.stderr[-4000:]  # the job's own exit code
    doc = json.loads(out.read_text())
    failure = doc["failure"]
    assert failure["exception"] == "RuntimeError" and failure["message"] == MESSAGE
    assert failure["step"] == 3 and failure["exit_code"] == 1 and failure["signal"] is None
    assert failure["site"] == f"{SCRIPT}:{RAISE_LINE}"
    lead = f"The job failed at step 3: RuntimeError: {MESSAGE} (newcomer_trainer.py:{RAISE_LINE})"
    assert failure["summary"] == lead
    # 2 steps measured (the warm-up's first is start-up): no finding keeps its rule's confidence
    assert len(doc["profile"]["ranks"][0]["steps"]) == 2
    assert doc["findings"], "the padded, eager job still shows its causes"
    assert all(f["confidence"] <= 2 / FULL_CONFIDENCE_STEPS + 0.005 for f in doc["findings"]), doc["findings"]
    assert all(f["severity"] == "low" for f in doc["findings"])
    # the terminal: the first line after the header names the failure, before any finding
    report = crashed.stdout
    after_header = [line for line in report.split("╯", 1)[1].splitlines() if line.strip()]
    assert after_header[0].strip() == lead, report[-4000:]
    assert report.index(lead) < report.index("Findings")
    # the history keeps it, as failed
    listed = run_pitstop("history", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "doctor, failed" in listed.stdout and f"#1: {lead}" in listed.stdout, listed.stdout
    # a later successful run of the same job is not compared with it
    good = tmp_path / "good.json"
    ok = run_pitstop(
        "doctor", "--quiet", "--warmup", "1", "--steps", "5", "--json", str(good), "--",
        sys.executable, str(SCRIPT), "--steps", "40", *SMALL, env=env, timeout=600,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr[-4000:]
    later = json.loads(good.read_text())
    assert later["failure"] is None and later["profile"]["baseline"] is None
    rows = json.loads(run_pitstop("history", "list", "--json", env=env).stdout)
    assert [(r["id"], r["failure"] is not None) for r in rows] == [(2, False), (1, True)]
    assert rows[1]["fingerprint"] == rows[0]["fingerprint"]  # the same workload: excluded for failing only
