"""pitstop attach on real CPU jobs started outside pitstop, with issue 40's causes planted
(``tests/scripts/attach/settings_loop.py``): the sampled stacks show the job's ``gc.collect()`` line and
anomaly mode at work; under torchrun, the stacks show DDP's unused-parameter search and the job's own log
(its output redirected to a file) says no parameter went unused. Each job runs on to its own exit code."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import attach_json

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "scripts" / "attach" / "settings_loop.py"
PY_SPY = Path(sys.executable).parent / "py-spy"
TORCHRUN = Path(sys.executable).parent / "torchrun"
NEEDS_PY_SPY = pytest.mark.skipif(
    not PY_SPY.exists(), reason="py-spy is not installed (pip install 'pitstop[attach]')"
)


def _line_of(text: str) -> int:
    return next(i for i, line in enumerate(JOB.read_text().splitlines(), 1) if text in line)


def _wait_for(log: Path, word: str, job: subprocess.Popen[bytes], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and word in log.read_text(errors="replace"):
            return
        if job.poll() is not None:
            raise AssertionError("the job ended early:\n" + log.read_text(errors="replace")[-3000:])
        time.sleep(0.5)
    raise AssertionError(f"no {word!r} in the job's output:\n" + log.read_text(errors="replace")[-3000:])


def _finish(job: subprocess.Popen[bytes], log: Path) -> str:
    try:
        job.wait(timeout=180)
    finally:
        if job.poll() is None:
            job.kill()
    return log.read_text(errors="replace")


@pytest.mark.slow
@NEEDS_PY_SPY
def test_attach_names_the_jobs_gc_collect_and_anomaly_mode(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_LAUNCH_BLOCKING": "1"}
    with log.open("wb") as out:
        job = subprocess.Popen(
            [sys.executable, str(JOB), "--seconds", "40", "--collect", "--anomaly"],
            stdout=out,
            stderr=out,
            env=env,
        )
    try:
        _wait_for(log, "step 50", job)  # in the loop, past the first steps
        doc = attach_json(job.pid, 8, tmp_path / "attach.json")
    finally:
        rest = _finish(job, log)
    assert job.returncode == 0 and "done" in rest  # the job ran on and exited as it would have
    findings = {f["cause"]: f for f in doc["findings"]}
    cleanup = findings["per_step_cleanup"]["evidence"]
    assert cleanup["view"] == "sampled" and cleanup["sampled_share"] > 0.05
    site = f"{JOB}:{_line_of('gc.collect()  # the planted call')} in main"
    assert site in str(cleanup), cleanup  # the job's own line, read from the samples
    debug = findings["debug_modes"]["evidence"]
    assert debug["view"] == "sampled" and debug["anomaly_detection_steps"] > 0
    assert debug["sampled_share"] > 0.0
    rank = doc["profile"]["ranks"][0]
    assert rank["debug_modes"]["settings"] == ["CUDA_LAUNCH_BLOCKING=1"]  # /proc/PID/environ (costs on a GPU)
    assert any(f"read the job's output {log}" in n for n in doc["notes"])


@pytest.mark.slow
@NEEDS_PY_SPY
def test_attach_to_torchrun_sees_ddps_search_and_reads_its_warning(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        str(TORCHRUN),
        "--nproc-per-node",
        "2",
        str(JOB),
        "--seconds",
        "45",
        "--find-unused",
        "--layers",
        "48",
    ]
    with log.open("wb") as out:
        job = subprocess.Popen(cmd, stdout=out, stderr=out, env=env)
    try:
        _wait_for(log, "find_unused_parameters=True was specified", job)
        _wait_for(log, "step 50", job)
        doc = attach_json(job.pid, 10, tmp_path / "attach.json")
    finally:
        rest = _finish(job, log)
    assert job.returncode == 0 and rest.count("done") == 2, rest[-3000:]
    assert sorted(r["rank"] for r in doc["ranks"]) == [0, 1]
    for rank in doc["profile"]["ranks"]:
        ddp = rank["ddp"]
        assert ddp["find_unused_parameters"] is True and ddp["unused_parameters"] == 0
        assert "train.log" in ddp["set_by"]
    finding = {f["cause"]: f for f in doc["findings"]}["ddp_find_unused"]
    assert finding["evidence"]["view"] == "sampled" and finding["evidence"]["unused_parameters"] == 0
