"""pitstop attach on a real CPU training job started outside pitstop: the planted slow DataLoader (a sleep in
``__getitem__``, num_workers=0) is found from sampled stacks with its evidence, and the job runs on to its
own exit code with its losses printed as before. A PID that is gone is one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import attach_json

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "scripts" / "attach" / "slow_loader.py"
PY_SPY = Path(sys.executable).parent / "py-spy"


def _start_job(seconds: float, tmp: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        str(JOB),
        "--seconds",
        str(seconds),
        "--step-times",
        str(tmp / "steps.txt"),
        *extra,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _wait_ready(job: subprocess.Popen[str]) -> list[str]:
    """Lines up to 'ready' (torch imported, the loop about to start), then a couple of steps."""
    lines = []
    assert job.stdout is not None
    for line in job.stdout:
        lines.append(line)
        if line.startswith("ready"):
            time.sleep(1.0)
            return lines
    raise AssertionError("the job ended before it was ready:\n" + "".join(lines))


@pytest.mark.slow
@pytest.mark.skipif(not PY_SPY.exists(), reason="py-spy is not installed (pip install 'pitstop[attach]')")
def test_attach_finds_the_planted_slow_loader(tmp_path: Path) -> None:
    job = _start_job(seconds=25, tmp=tmp_path)
    try:
        _wait_ready(job)
        out = tmp_path / "attach.json"
        doc = attach_json(job.pid, 6, out)
        rest, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0  # the job ran on and exited as it would have
    assert "loss" in rest and "done" in rest  # its losses kept coming during and after the window
    assert doc["source"] == "attach"
    if sys.version_info < (3, 14):  # the job runs this interpreter: no PEP 768, said, and sampled instead
        version = ".".join(map(str, sys.version_info[:3]))
        assert doc["notes"][0] == (
            f"full probe not armed (PID {job.pid} runs Python {version}: sys.remote_exec (PEP 768) needs the "
            "job on 3.14 or newer): the stacks were sampled instead"
        )
    counted = doc["environment"]["counted"]
    assert counted.startswith("steps from ") and counted.endswith(
        "tokens unknown (not in a stack, and no log of the job's was read)"
    )
    findings = {f["cause"]: f for f in doc["findings"]}
    assert next(iter(findings)) == "dataloader_bound"  # ranked first
    ev = findings["dataloader_bound"]["evidence"]
    assert ev["num_workers"] == 0  # seen in the stack: _SingleProcessDataLoaderIter
    assert ev["view"] == "sampled" and ev["samples"] >= 200
    assert ev["sampled_share"] > 0.4
    lo, hi = ev["sampled_ci95"]
    assert lo <= ev["sampled_share"] <= hi
    assert doc["environment"]["framework"] == "pytorch" and doc["environment"]["device"] == "cpu"
    assert "padding_waste" not in findings  # tokens are unknown to a sampled view: nothing guessed
    steps = [float(line.split()[1]) for line in (tmp_path / "steps.txt").read_text().splitlines()]
    assert len(steps) > 20


@pytest.mark.slow
@pytest.mark.skipif(not PY_SPY.exists(), reason="py-spy is not installed (pip install 'pitstop[attach]')")
def test_attach_sees_a_planted_checkpoint_stall(tmp_path: Path) -> None:
    """torch.save of ~64 MB every 30 steps: the saving share, the saves counted, the checkpoint_stall finding."""
    extra = ("--sleep", "0.0005", "--save-every", "30", "--save-dir", str(tmp_path))
    job = _start_job(30, tmp_path, *extra)
    try:
        _wait_ready(job)
        out = tmp_path / "attach.json"
        doc = attach_json(job.pid, 8, out)
        job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0
    stall = {f["cause"]: f for f in doc["findings"]}["checkpoint_stall"]
    ev = stall["evidence"]
    assert ev["view"] == "sampled" and ev["checkpoints"] >= 2 and ev["sampled_share"] > 0.01
    assert any("saving" in note for note in doc["notes"])


TWO_RANKS = ROOT / "tests" / "scripts" / "attach" / "two_ranks.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"


@pytest.mark.slow
@pytest.mark.skipif(not PY_SPY.exists(), reason="py-spy is not installed (pip install 'pitstop[attach]')")
def test_attach_to_torchrun_sees_both_ranks_and_the_straggler(tmp_path: Path) -> None:
    """The launcher's PID: both ranks are found below it (RANK from their environment), rank 1's slow loader
    makes it the straggler, and rank 0's time is in its all_reduce."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(TORCHRUN), "--nproc-per-node", "2", str(TWO_RANKS), "--seconds", "25"]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert job.stdout is not None
        for line in job.stdout:  # the first logged step: both ranks are in their loop
            if line.startswith("step "):
                break
        out = tmp_path / "attach.json"
        doc = attach_json(job.pid, 6, out)
        rest, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0 and "done" in rest, rest[-3000:]
    assert sorted(r["rank"] for r in doc["ranks"]) == [0, 1]
    findings = {f["cause"]: f for f in doc["findings"]}
    assert findings["straggler"]["evidence"]["slow_rank"] == 1
    assert findings["dataloader_bound"]["evidence"]["sampled_rank"] == 1
    notes = " ".join(doc.get("notes", []))
    assert "collectives" in notes and "step together" in notes


@pytest.mark.slow
def test_attach_to_a_gone_pid_is_one_line_and_exit_2() -> None:
    probe = subprocess.Popen([sys.executable, "-c", "pass"])
    probe.wait()
    done = subprocess.run(
        [sys.executable, "-m", "pitstop", "attach", str(probe.pid), "--for", "2s"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == f"pitstop: no process with PID {probe.pid}"
    bad = subprocess.run(
        [sys.executable, "-m", "pitstop", "attach", "1", "--for", "soon"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--for" in bad.stderr and "Traceback" not in bad.stderr
