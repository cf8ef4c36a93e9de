"""Nothing measured is lost whatever ends the job, and the job never outlives pitstop.

Real processes throughout: a tiny Llama pretraining loop that dies by a signal after 10 optimizer steps (the
OOM killer's SIGKILL, a segfault, a SIGTERM), one that ignores SIGINT and SIGTERM, and a pitstop killed
with SIGKILL in the middle of a job with a DataLoader worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import ROOT, SCRIPTS, run_pitstop, start_as_at_a_terminal

pytestmark = pytest.mark.slow
SCRIPT = str(SCRIPTS / "dying_loop.py")


def _doctor_args(out: Path, *script_args: str, full: bool = False) -> list[str]:
    window = ["--full"] if full else ["--steps", "50"]
    return [
        "doctor", "--quiet", "--warmup", "2", *window, "--json", str(out), "--",
        sys.executable, SCRIPT, *script_args,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("SIGKILL", "the OOM killer's way"),
        ("SIGSEGV", "a crash in native code"),
        ("SIGTERM", "asked to stop"),
    ],
)
def test_a_job_killed_by_a_signal_keeps_its_steps(tmp_path: Path, name: str, why: str) -> None:
    out = tmp_path / "run.json"
    proc = run_pitstop(*_doctor_args(out, "--die-by", name, "--after", "10", "--steps", "100"))
    number = int(getattr(signal, name))
    assert proc.returncode == 128 + number, proc.stderr  # the shell's convention: 137, 139, 143
    said = f"the job was killed by {name} ({why}"
    assert said in proc.stderr and "after 8 measured steps" in proc.stderr
    assert "Ctrl-C" not in proc.stderr
    doc = json.loads(out.read_text())
    assert doc["metrics"]["steps_measured"] == 8  # 10 steps, 2 of them warm-up
    assert doc["exit_code"] == 128 + number
    assert any(said in note for note in doc["notes"])
    assert doc["metrics"]["real_tokens_per_s"] > 0  # no mask: every token of the full blocks is real
    assert "pitstop doctor" in proc.stdout  # the report itself is rendered


def test_a_job_dying_before_its_first_step_says_by_what(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    proc = run_pitstop(*_doctor_args(out, "--die-by", "SIGKILL", "--after", "1", "--steps", "100"))
    assert proc.returncode == 137
    assert "was killed by SIGKILL (the OOM killer's way) before its first optimizer step" in proc.stderr


_STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _nothing_left_behind() -> Iterator[None]:
    """A failing test must not leave its pitstop (nor the job of an old pitstop) running on the machine."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()
            proc.kill()
            proc.communicate()


def _start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    """pitstop in the background, its scratch folders under tmp_path (where the test watches the rank file)."""
    env = {
        **os.environ,
        "TMPDIR": str(tmp_path),
        "PITSTOP_CACHE": str(ROOT / ".pytest_cache" / "pitstop-cache"),
        "COLUMNS": "120",
    }
    proc = start_as_at_a_terminal([sys.executable, "-m", "pitstop", *args], env)
    _STARTED.append(proc)
    return proc


def _wait_for_steps(tmp_path: Path, proc: subprocess.Popen[str], steps: int, limit_s: float = 240) -> None:
    """Until the job's rank file holds ``steps`` step lines (what the probe appends as steps finish)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for path in tmp_path.glob("pitstop-*/rank-*.jsonl"):
            lines = path.read_text(errors="replace").splitlines()
            if sum('"kind":"step"' in line for line in lines) >= steps:
                return
        time.sleep(0.2)
    raise AssertionError(f"the job did not reach {steps} steps")


def _measured(doc: dict[str, Any]) -> int:
    return int(doc["metrics"]["steps_measured"])


def test_a_job_that_ignores_sigint_and_sigterm_is_killed_and_keeps_its_steps(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    pitstop = _start(tmp_path, *_doctor_args(out, "--ignore-stop", "--steps", "1000000", full=True))
    _wait_for_steps(tmp_path, pitstop, 12)
    pitstop.send_signal(signal.SIGINT)
    _, err = pitstop.communicate(timeout=120)
    assert pitstop.returncode == 130, err
    assert "did not end on SIGINT or SIGTERM, and was killed with SIGKILL" in err
    doc = json.loads(out.read_text())
    assert _measured(doc) >= 10  # at least what the file held when Ctrl-C came (12, 2 of them warm-up)
    assert any("killed with SIGKILL" in n for n in doc["notes"])


def test_sigterm_to_pitstop_says_sigterm(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    pitstop = _start(tmp_path, *_doctor_args(out, "--steps", "1000000", full=True))
    _wait_for_steps(tmp_path, pitstop, 6)
    pitstop.send_signal(signal.SIGTERM)
    _, err = pitstop.communicate(timeout=120)
    assert pitstop.returncode == 143, err
    assert "stopped because pitstop got SIGTERM" in err and "Ctrl-C" not in err
    assert _measured(json.loads(out.read_text())) >= 4


def test_the_job_does_not_outlive_a_killed_pitstop(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    pitstop = _start(tmp_path, *_doctor_args(out, "--workers", "1", "--steps", "1000000", full=True))
    _wait_for_steps(tmp_path, pitstop, 4)
    family = psutil.Process(pitstop.pid).children(recursive=True)
    job = [p for p in family if SCRIPT in _cmdline(p)]
    assert len(job) >= 2  # the trainer and its DataLoader worker
    pitstop.kill()  # SIGKILL: pitstop cleans up nothing itself
    pitstop.communicate(timeout=30)
    _, alive = psutil.wait_procs(family, timeout=60)
    assert _still_running(alive) == []


def test_a_job_without_python_does_not_outlive_a_killed_pitstop(tmp_path: Path) -> None:
    # no Python process to carry a parent-death signal: the reaper alone ends the group
    pitstop = _start(tmp_path, "doctor", "--quiet", "--", "sh", "-c", "sleep 4321; echo unreachable")
    deadline = time.monotonic() + 120
    family: list[psutil.Process] = []
    while time.monotonic() < deadline and not any("4321" in _cmdline(p) for p in family):
        time.sleep(0.2)
        family = psutil.Process(pitstop.pid).children(recursive=True)
    sleeper = [p for p in family if "4321" in _cmdline(p)]
    assert sleeper
    pitstop.kill()
    pitstop.communicate(timeout=30)
    _, alive = psutil.wait_procs(family, timeout=60)
    assert _still_running(alive) == []


def _cmdline(process: psutil.Process) -> str:
    """The command line, or "" for a process that has already gone (a short-lived helper, on a busy
    machine, can end between the listing of the family and this look)."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def _still_running(processes: list[psutil.Process]) -> list[str]:
    """Those still running (not gone, not a zombie), by command line."""
    running = []
    for p in processes:
        with contextlib.suppress(psutil.Error):  # gone between the two looks: not running
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                running.append(f"{p.pid}: {_cmdline(p)}")
    return running


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_the_top_process_carries_a_parent_death_signal(tmp_path: Path, sigint: str) -> None:
    # a parent (standing in for pitstop) starts a child that arms die_with_runner, then dies by SIGKILL: the
    # child gets SIGINT, as the user's Ctrl-C, and its `finally:` runs; one that ignores SIGINT gets SIGKILL
    child_code = (
        "import os, sys, time; from pitstop.probe.bootstrap import die_with_runner\n"
        "try:\n    print(die_with_runner(), flush=True)\n    time.sleep(600)\n"
        "finally:\n    print('cleanup', flush=True)"
    )
    parent_code = (
        "import os, signal, subprocess, sys, time; "
        f"signal.signal(signal.SIGINT, signal.{'SIG_DFL' if sigint == 'default' else 'SIG_IGN'}); "
        f"env = dict(os.environ, PITSTOP_RUNNER_PID=str(os.getpid())); "
        f"c = subprocess.Popen([sys.executable, '-c', {child_code!r}], env=env); "
        "print(c.pid, flush=True); time.sleep(600)"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    armed = parent.stdout.readline().strip()  # the child's line comes through the inherited stdout
    assert armed == "True"
    parent.kill()
    parent.wait()
    _, alive = psutil.wait_procs([child], timeout=60)
    assert alive == []
    said = parent.stdout.read()  # to the end: the child held the pipe until it ended
    assert ("cleanup" in said) == (sigint == "default"), said
