"""A probe that fails at the job's first step ends the run at once, with one line naming the error, whatever
command runs it: doctor, watch, tune, and doctor over two torchrun ranks of which one lost its probe (issue 40:
doctor waited on a window that never came while the job trained on unobserved).

Each job would train for tens of minutes (100000 steps); the tests' timeouts are two minutes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import SCRIPTS, run_pitstop

pytestmark = pytest.mark.slow

FOREVER = ("--steps", "100000")  # tens of minutes of training on a CPU
TIMEOUT_S = 120


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""


@pytest.mark.parametrize("command", ["doctor", "watch"])
def test_a_lost_probe_ends_the_run_with_its_error(command: str) -> None:
    proc = run_pitstop(
        command,
        "--no-history",
        "--",
        sys.executable,
        str(SCRIPTS / "faulty_probe.py"),
        *FOREVER,
        timeout=TIMEOUT_S,
    )
    last = _last_line(proc)
    assert last.startswith("pitstop: the probe failed in `")
    assert "RuntimeError: injected fault" in last and "pitstop stopped the job" in last
    assert proc.returncode == 1


def test_tune_says_its_first_window_lost_the_probe() -> None:
    proc = run_pitstop(
        "tune",
        "--no-history",
        "--",
        sys.executable,
        str(SCRIPTS / "faulty_probe.py"),
        *FOREVER,
        timeout=TIMEOUT_S,
    )
    last = _last_line(proc)
    assert "the probe failed" in last and "RuntimeError: injected fault" in last
    assert proc.returncode != 0


def test_one_lost_rank_of_two_ends_the_run_and_is_named() -> None:
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2")
    proc = run_pitstop(
        "doctor",
        "--quiet",
        "--no-history",
        "--",
        *torchrun,
        str(SCRIPTS / "faulty_probe.py"),
        "--faulty-rank",
        "1",
        "--script",
        "ddp.py",
        *FOREVER,
        timeout=TIMEOUT_S,
    )
    last = _last_line(proc)
    assert "the probe failed on rank 1 of 2" in last and "RuntimeError: injected fault" in last
    assert proc.returncode == 1
