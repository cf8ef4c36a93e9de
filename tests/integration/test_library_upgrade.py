"""A library upgrade that made a real job slower, through the real CLI: ``pitstop doctor`` with its history on,
``pitstop history compare`` and ``pitstop history check``.

The job (tests/scripts/upgrade_loop.py) fine-tunes a tiny Llama from Transformers. Run 1 presents older
versions of transformers and torch (as an older installation's modules report them; the probe reads them from
the loaded modules) and is fast; run 2 runs the installed versions with a slowdown planted in the model's
forward (a sleep of 60 ms a step: several times the step's compute on a busy 2-core machine). Run 3 is fast
with the installed versions, run 4 slow with them: the same versions, so no upgrade is named.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SCRIPTS, run_pitstop

pytestmark = pytest.mark.slow

SLOW_FORWARD_MS = "60"
PRETEND = "transformers=4.57.1,torch=2.8.0+cpu"


def _doctor(history: Path, out: Path, *job: str) -> dict[str, Any]:
    proc = run_pitstop(
        "doctor", "--quiet", "--warmup", "3", "--steps", "12", "--json", str(out), "--history", str(history),
        "--", sys.executable, str(SCRIPTS / "upgrade_loop.py"), *job,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "recorded as run" in proc.stderr
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    where = tmp_path_factory.mktemp("upgrade")
    history = where / "history.sqlite3"
    jobs = [
        ("--pretend", PRETEND),
        ("--slow-forward-ms", SLOW_FORWARD_MS),
        (),
        ("--slow-forward-ms", SLOW_FORWARD_MS),
    ]
    return history, [_doctor(history, where / f"run{i + 1}.json", *job) for i, job in enumerate(jobs)]


def _history(history: Path, *args: str) -> Any:
    return run_pitstop("history", *args, "--history", str(history), env={"COLUMNS": "200"})


def test_doctor_names_the_upgrade_the_packages_and_the_slowed_phase(runs: Any) -> None:
    _, docs = runs
    first, second = docs[0], docs[1]
    assert first["environment"]["versions"]["transformers"] == "4.57.1"
    assert not [f for f in first["findings"] if f["cause"] == "library_upgrade"]  # nothing to compare with
    found = [f for f in second["findings"] if f["cause"] == "library_upgrade"]
    assert found, [f["cause"] for f in second["findings"]]
    ev = found[0]["evidence"]
    installed = second["environment"]["versions"]
    assert ev["packages_changed"] == {
        "torch": f"2.8.0+cpu → {installed['torch']}",
        "transformers": f"4.57.1 → {installed['transformers']}",
    }
    assert "accelerate" not in ev["packages_changed"]  # loaded by both at the same version
    assert ev["baseline_run"] == 1 and ev["slowest_phase"] == "forward"
    assert ev["slowdown"] > ev["noise"] and ev["throughput_ratio"] < 0.75
    assert found[0]["est_speedup"] == pytest.approx(1 / ev["throughput_ratio"], rel=1e-3)
    assert found[0]["speedup_basis"].startswith("the baseline run #1 on ")
    assert '"transformers==4.57.*"' in found[0]["fix"]["snippets"]["pytorch"]
    assert second["profile"]["baseline"]["run_id"] == 1  # what the rule was given, kept in the document


def test_the_same_versions_and_a_slowdown_name_no_upgrade(runs: Any) -> None:
    _, docs = runs
    fourth = docs[3]
    assert fourth["profile"]["baseline"]["run_id"] == 3  # the newest run of the workload: fast, same versions
    assert fourth["metrics"]["real_tokens_per_s"] < 0.75 * docs[2]["metrics"]["real_tokens_per_s"]
    assert "library_upgrade" not in [f["cause"] for f in fourth["findings"]]


def test_history_compare_shows_the_versions_the_phases_and_the_finding(runs: Any) -> None:
    history, docs = runs
    result = _history(history, "compare", "1", "2")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    installed = docs[1]["environment"]["versions"]["transformers"]
    assert "library versions changed (A → B): torch 2.8.0+cpu → " in out
    assert f"transformers 4.57.1 → {installed}" in out
    assert "forward / step" in out and "library_upgrade: A library upgrade made the run slower" in out
    assert "The phase that grew most: forward" in out and 'pip install "torch==2.8.*"' in out
    assert "different setups" not in result.stderr  # an upgrade keeps the fingerprint
    same = _history(history, "compare", "3", "4")
    assert same.returncode == 0, same.stderr
    assert "library versions changed" not in same.stdout and "library_upgrade" not in same.stdout
    assert "forward / step" in same.stdout


def test_history_check_names_the_upgrade_on_its_one_line(runs: Any) -> None:
    history, _ = runs
    upgraded = _history(history, "check", "--baseline", "1", "--run", "2", "--max-drop", "10%")
    assert upgraded.returncode == 1, upgraded.stdout + upgraded.stderr
    line = upgraded.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("pitstop: regression: run #2")
    assert "library versions changed since run #1: torch 2.8.0+cpu → " in line
    assert "(library_upgrade, forward grew most" in line
    same = _history(history, "check", "--baseline", "3", "--run", "4", "--max-drop", "10%")
    assert same.returncode == 1 and "library" not in same.stderr
