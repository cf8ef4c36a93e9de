"""The job behaves as it does without pitstop, its own cleanup runs, and nothing it started outlives pitstop.

Real processes throughout (tests/scripts/lifecycle/job.py): a job that makes itself its group's leader, one
that uses job control, one whose `finally:` / `atexit` handlers write a marker, and one that starts a server
in a session of its own and a daemon (double fork) that it never ends itself. Each way pitstop ends is
tried: the window's end, Ctrl-C, and `kill -9` of pitstop itself.
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

import psutil
import pytest

from tests.conftest import ROOT, SCRIPTS, start_as_at_a_terminal

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreaper and /proc are Linux's"),
]
JOB = str(SCRIPTS / "lifecycle" / "job.py")


def _doctor(out: Path, *job_args: str, full: bool = False) -> list[str]:
    window = ["--full"] if full else ["--steps", "4"]
    return [
        "doctor",
        "--quiet",
        "--warmup",
        "2",
        *window,
        "--json",
        str(out),
        "--",
        sys.executable,
        JOB,
        *job_args,
    ]


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pitstop to its end, SIGINT at its default as at a terminal (pitstop's window end is a Ctrl-C)."""
    pitstop = _start(tmp_path, *args)
    out, err = pitstop.communicate(timeout=300)
    return subprocess.CompletedProcess(pitstop.args, pitstop.returncode, out, err)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _left_behind(folder: Path) -> list[int]:
    """The server and the daemon the job started and never ended itself."""
    pids = []
    for name in ("server.pid", "daemon.pid"):
        assert (folder / name).exists(), f"the job did not start its {name[:-4]}"
        pids.append(int((folder / name).read_text()))
    return pids


def _still_running(pids: list[int], limit_s: float = 60) -> list[int]:
    """Those still running after waiting up to ``limit_s`` for them to end (a zombie has ended)."""
    deadline = time.monotonic() + limit_s
    running = pids
    while running and time.monotonic() < deadline:
        time.sleep(0.1)
        running = [pid for pid in running if _a_sleeper(pid)]
    return running


def _a_sleeper(pid: int) -> bool:
    """Whether ``pid`` is still one of the job's sleepers (not gone, not a zombie, not a reused PID)."""
    with contextlib.suppress(psutil.Error):
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and "time.sleep(3600)" in " ".join(process.cmdline())
    return False


@pytest.fixture
def servers() -> Iterator[list[int]]:
    """What a failing test leaves running is killed (the test asserts on it before)."""
    started: list[int] = []
    yield started
    for pid in started:
        if _a_sleeper(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_a_job_that_leads_its_own_group_runs_as_without_pitstop(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    proc = _run(tmp_path, *_doctor(tmp_path / "run.json", "--setpgid", "--marker", str(marker)))
    assert proc.returncode == 0, proc.stderr  # was: PermissionError, the command led a session
    assert _lines(marker)[0] == "setpgid: ok, leads True"
    assert json.loads((tmp_path / "run.json").read_text())["metrics"]["steps_measured"] == 4


def test_job_control_in_the_job_keeps_working(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    proc = _run(tmp_path, *_doctor(tmp_path / "run.json", "--job-control", "--marker", str(marker)))
    assert proc.returncode == 0, proc.stderr
    assert _lines(marker)[0] == "job control: ok"


def test_the_window_end_runs_the_jobs_cleanup_and_ends_what_left_its_group(
    tmp_path: Path, servers: list[int]
) -> None:
    marker = tmp_path / "marker"
    out = tmp_path / "run.json"
    proc = _run(tmp_path, *_doctor(out, "--server", str(tmp_path), "--marker", str(marker)))
    servers += _left_behind(tmp_path)
    assert proc.returncode == 0, proc.stderr  # a job pitstop stopped after its window is a success
    assert _lines(marker)[-2:] == ["finally", "atexit"]  # stopped as Ctrl-C does: its handlers ran
    doc = json.loads(out.read_text())
    assert doc["exit_code"] == 0 and doc["metrics"]["steps_measured"] == 4
    assert _still_running(servers) == []


def _start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "TMPDIR": str(tmp_path),
        "PITSTOP_CACHE": str(ROOT / ".pytest_cache" / "pitstop-cache"),
    }
    return start_as_at_a_terminal([sys.executable, "-m", "pitstop", *args], env)


def _wait_for_steps(
    pitstop: subprocess.Popen[str], marker: Path, steps: int = 5, limit_s: float = 240
) -> None:
    deadline = time.monotonic() + limit_s
    while len(_lines(Path(f"{marker}.steps"))) < steps:
        assert pitstop.poll() is None, pitstop.communicate()
        assert time.monotonic() < deadline, f"the job did not reach {steps} steps"
        time.sleep(0.2)


@pytest.mark.parametrize("how", ["ctrl-c", "kill -9"])
def test_what_left_the_group_ends_with_pitstop_however_it_ends(
    tmp_path: Path, servers: list[int], how: str
) -> None:
    marker = tmp_path / "marker"
    pitstop = _start(
        tmp_path,
        *_doctor(tmp_path / "run.json", "--server", str(tmp_path), "--marker", str(marker), full=True),
    )
    try:
        _wait_for_steps(pitstop, marker)
        servers += _left_behind(tmp_path)
        time.sleep(1.5)  # pitstop tells its reaper what left the group once a second
        pitstop.send_signal(signal.SIGINT if how == "ctrl-c" else signal.SIGKILL)
        pitstop.communicate(timeout=120)
    finally:
        if pitstop.poll() is None:
            pitstop.kill()
    assert pitstop.returncode == (130 if how == "ctrl-c" else -9)
    assert _still_running(servers) == []
    deadline = time.monotonic() + 60  # after kill -9 the job's Ctrl-C comes as its parent-death signal
    while "atexit" not in _lines(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _lines(marker)[-2:] == ["finally", "atexit"]
