"""`pitstop analyze` / `pitstop check` end to end, on traces recorded here from real CPU trainings with a
planted cause, and on the shared artifacts; bad input gets a one-line error and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, run_pitstop

pytestmark = pytest.mark.slow


def _record(tmp_path: Path, name: str, *args: str) -> Path:
    out = tmp_path / f"{name}.pt.trace.json"
    subprocess.run(
        [sys.executable, str(SCRIPTS / "profile_cpu.py"), str(out), *args], check=True, capture_output=True
    )
    return out


def _analyze(tmp_path: Path, *paths: Path | str) -> dict:
    out = tmp_path / "analyze.json"
    proc = run_pitstop("analyze", *map(str, paths), "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def test_planted_causes_in_recorded_cpu_traces(tmp_path: Path) -> None:
    # 8 examples x 150 ms of blocking reads per step: most of the step even when a busy machine slows
    # compute (at 60 ms, a machine running three other jobs once brought the share down to 0.3)
    slow = _analyze(tmp_path, _record(tmp_path, "slow", "--slow-ms", "150"))
    first = slow["findings"][0]
    assert first["cause"] == "dataloader_bound"
    assert first["evidence"]["data_wait_frac"] > 0.3  # ~0.8 on an idle machine
    assert slow["environment"]["device"] == "cpu"

    base = _analyze(tmp_path, _record(tmp_path, "base"))
    item = _analyze(tmp_path, _record(tmp_path, "item", "--item"))
    syncs = [doc["metrics"]["syncs_per_step"] for doc in (base, item)]  # the steps' syncs, one rank
    assert syncs[1] == pytest.approx(syncs[0] + 1)  # the planted .item() adds exactly one per step
    assert "host_sync" in item["skipped_checks"]  # on a CPU it blocks on nothing: a GPU-only check

    padded = _analyze(tmp_path, _record(tmp_path, "padded", "--pad-to", "256"))
    assert padded["metrics"]["padding_frac"] is None  # a trace does not know which tokens are padding
    assert "padding_waste" not in [f["cause"] for f in padded["findings"]]


@pytest.mark.smoke
def test_analyze_a_folder_of_traces_and_check_configs(tmp_path: Path, shared_data: Path) -> None:
    doc = _analyze(tmp_path, shared_data / "traces")
    assert len(doc["ranks"]) == 5 and all(kind == "kineto_trace" for kind in doc["inputs"].values())
    check_out = tmp_path / "check.json"
    proc = run_pitstop("check", str(shared_data / "configs" / "deepspeed"), "--json", str(check_out))
    assert proc.returncode == 0, proc.stderr
    check = json.loads(check_out.read_text())
    assert check["source"] == "check"
    assert "offload_bound" in [f["cause"] for f in check["findings"]]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("truncated.json.gz", "truncated"),
        ("bomb.yaml", "alias bomb"),
        ("training_args.bin", "never unpickles"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(name: str, message: str) -> None:
    proc = run_pitstop("analyze", str(Path(__file__).resolve().parents[1] / "corpus" / name))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr


def test_check_refuses_a_trace_and_an_unknown_gpu(shared_data: Path) -> None:
    trace = next((shared_data / "traces").glob("*.gz"))
    proc = run_pitstop("check", str(trace))
    assert proc.returncode == 2 and "not a config" in proc.stderr
    proc = run_pitstop("analyze", str(trace), "--gpu", "Voodoo5")
    assert proc.returncode == 2 and "hardware table" in proc.stderr
