"""``pitstop history`` end to end: real documents in a real SQLite file, the CLI's output and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from pitstop.cli.history import history_app
from pitstop.diagnose import diagnose
from pitstop.history import open_store, record
from tests.factories import profile, steps

app = typer.Typer()
app.add_typer(history_app, name="history")  # as app.py mounts it
runner = CliRunner()


def run_doc(wall: float = 0.15, row_len: int = 1024, **env: Any) -> dict[str, Any]:
    prof = profile(
        "cuda",
        steps(wall=wall, data=0.001, real_frac=0.99, row_len=row_len),
        util=97.0,
        versions={"torch": "2.5.1", "transformers": "4.46.3"},
        **env,
    )
    prof.command = ["accelerate", "launch", "--num_processes", "1", "train_sft.py", "--config", "sft.yaml"]
    return diagnose(prof).to_dict()


def history(*args: str) -> Any:
    return runner.invoke(app, ["history", *args], env={"COLUMNS": "200"})


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


@pytest.fixture
def runs() -> dict[str, int]:
    """main: a 1k-context baseline; pr: the same setup 20% slower; long: a 4k-context run."""
    return {
        "main": record(run_doc(wall=0.10), "doctor", label="main"),
        "pr": record(run_doc(wall=0.12), "doctor", label="pr"),
        "long": record(run_doc(wall=0.30, row_len=4096), "doctor", label="long"),
    }


def test_list_table_and_json(runs: dict[str, int], history_file: Path) -> None:
    result = history("list")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [ln.split()[0] for ln in lines if ln.strip()[:1].isdigit()] == ["3", "2", "1"]
    assert "main" in result.stdout and "accelerate launch" in result.stdout
    assert str(history_file) in result.stdout
    data = json.loads(history("list", "--json", "--label", "main").stdout)
    assert [r["id"] for r in data] == [runs["main"]]
    assert data[0]["kind"] == "doctor" and data[0]["fingerprint_fields"]["seq_len"] == 1024
    assert len(json.loads(history("list", "--json", "--limit", "2").stdout)) == 2
    assert json.loads(history("list", "--json", "--kind", "tune").stdout) == []


def test_empty_history_lists_nothing_and_creates_nothing(history_file: Path) -> None:
    result = history("list")
    assert result.exit_code == 0 and "no runs recorded" in result.stdout
    assert not history_file.exists()


def test_explicit_history_option(tmp_path: Path, history_file: Path) -> None:
    other = tmp_path / "team.sqlite3"
    record(run_doc(), "tune-window", path=other, label="team")
    data = json.loads(history("list", "--json", "--history", str(other)).stdout)
    assert [r["label"] for r in data] == ["team"]
    assert not history_file.exists()


def test_show(runs: dict[str, int]) -> None:
    result = history("show", str(runs["pr"]))
    assert result.exit_code == 0, result.output
    assert "run #2" in result.stdout and "pr" in result.stdout and "NVIDIA H100" in result.stdout
    stored = json.loads(history("show", str(runs["pr"]), "--json").stdout)
    assert stored == json.loads(json.dumps(run_doc(wall=0.12)))


def test_show_a_tune_result(runs: dict[str, int]) -> None:
    baseline_run = run_doc(wall=0.12)
    base = baseline_run["metrics"]["real_tokens_per_s"]
    best = {"fix": "padding_waste", "real_tokens_per_s": base * 1.5, "speedup": 1.5, "kept": True}
    doc = {
        "schema": "pitstop.tune/1",
        "baseline": {"real_tokens_per_s": base, "spread": 0.01},
        "best": best,
        "baseline_run": baseline_run,
    }
    run_id = record(doc, "tune", label="pr")
    result = history("show", str(run_id))
    assert result.exit_code == 0, result.output
    assert "×1.50 with padding_waste" in result.stdout
    assert f"{base * 1.5:,.0f}" in result.stdout


def test_show_unknown_id_is_one_line(runs: dict[str, int], history_file: Path) -> None:
    result = history("show", "99")
    assert result.exit_code == 2
    assert one_line(result.stderr) == f"pitstop: no run #99 in {history_file}"


def test_compare_same_setup(runs: dict[str, int]) -> None:
    result = history("compare", str(runs["main"]), str(runs["pr"]))
    assert result.exit_code == 0, result.output
    assert "×0.83" in result.stdout  # real tokens/s: 0.10 s / 0.12 s
    assert "×1.20" in result.stdout  # step time
    assert result.stderr == ""


def test_compare_warns_on_a_different_setup(runs: dict[str, int]) -> None:
    result = history("compare", str(runs["main"]), str(runs["long"]))
    assert result.exit_code == 0, result.output
    assert "seq_len" in one_line(result.stderr) and "different setups" in result.stderr
    assert "4096" in result.stdout and "≠" in result.stdout


def test_check_regression_and_ok(runs: dict[str, int]) -> None:
    slow = history("check", "--baseline", "main", "--run", str(runs["pr"]), "--max-drop", "5%")
    assert slow.exit_code == 1
    line = one_line(slow.stderr)
    assert line.startswith("pitstop: regression: run #2: real tokens/s")
    assert "16.7% slower" in line and "#1 (main)" in line and slow.stdout == ""
    ok = history("check", "--baseline", "main", "--run", str(runs["pr"]), "--max-drop", "0.2")
    assert ok.exit_code == 0, ok.output
    assert one_line(ok.stdout).startswith("ok: run #2") and ok.stderr == ""
    by_id = history("check", "--baseline", "1", "--run", "2", "--metric", "step_time_s", "--max-drop", "10%")
    assert by_id.exit_code == 1 and "step time 0.12 s vs 0.1 s" in by_id.stderr


def test_check_defaults_to_the_latest_run(runs: dict[str, int]) -> None:
    record(run_doc(wall=0.101), "doctor", label="pr")  # the newest run: 1% slower than main
    result = history("check", "--baseline", "main", "--max-drop", "5%")
    assert result.exit_code == 0, result.output
    assert one_line(result.stdout).startswith("ok: run #4") and "1.0% slower" in result.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--baseline", "main", "--run", "3"], "no doctor run labelled 'main' with fingerprint"),
        (["--baseline", "main", "--max-drop", "five"], "--max-drop 'five' is not a percentage"),
        (["--baseline", "main", "--max-drop", "5"], "between 0% and 100%"),
        (["--baseline", "main", "--run", "42"], "no run #42"),
        (["--baseline", "77", "--run", "2"], "no run #77"),
        (["--baseline", "main", "--run", "2", "--metric", "loss"], "unknown metric 'loss'"),
        (["--baseline", "2", "--run", "2"], "cannot be its own baseline"),
    ],
)
def test_check_bad_input_exits_2(runs: dict[str, int], args: list[str], says: str) -> None:
    result = history("check", *args)
    assert result.exit_code == 2, result.output
    assert says in one_line(result.stderr)


def test_check_on_an_empty_history_exits_2(history_file: Path) -> None:
    result = history("check", "--baseline", "main")
    assert result.exit_code == 2
    assert one_line(result.stderr) == f"pitstop: no runs recorded in {history_file}"


def test_check_with_a_baseline_id_of_another_setup_says_so(runs: dict[str, int]) -> None:
    result = history("check", "--baseline", str(runs["main"]), "--run", str(runs["long"]))
    assert result.exit_code == 0, result.output  # 4k rows carry more tokens per step
    line = one_line(result.stdout)
    assert line.startswith("ok: run #3") and "faster" in line
    assert line.endswith("(note: baseline run #1 has a different setup: seq_len)")


def test_a_corrupt_history_is_one_line_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite3"
    path.write_text("this is a training log, not a database\n")
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    for args in (["list"], ["show", "1"], ["check", "--baseline", "main"], ["compare", "1", "2"]):
        result = history(*args, "--history", str(path))
        assert result.exit_code == 2
        assert one_line(result.stderr) == f"pitstop: {path}: not an SQLite database; left untouched"
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before


_PROGRAM = """
import typer
from pitstop.cli.history import history_app
app = typer.Typer()
app.add_typer(history_app, name="history")
app()
"""


@pytest.mark.smoke
@pytest.mark.slow
def test_check_in_a_real_process_for_ci(runs: dict[str, int], history_file: Path) -> None:
    """What a CI job sees: the exit code and one line on stderr, no traceback."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROGRAM, "history", "check", "--baseline", "main", "--run", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert one_line(proc.stderr).startswith("pitstop: regression: run #2")
    with open_store(history_file, create=False) as store:
        assert store.count() == 3  # checking writes nothing
