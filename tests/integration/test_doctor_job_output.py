"""Issue 42, item 8: ``pitstop doctor`` on the newcomer's Trainer job (``tests/scripts/newcomer_trainer.py``)
shows no traceback when it stops the job after its window. The job's output from the stop on (its
``KeyboardInterrupt``) is in a log file the report names; pitstop's own lines start at the left edge even
while the job's tqdm bar leaves its line open.

On a pseudo-terminal (the panel view) and off one (plain lines on the stream the job's bar is drawn on)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_pitstop

pytestmark = pytest.mark.slow

JOB = [sys.executable, str(ROOT / "tests" / "scripts" / "newcomer_trainer.py"), "--steps", "400"]
DOCTOR = ["doctor", "--no-history", "--warmup", "2", "--steps", "8", "--"]
ALARMS = ("Traceback", "KeyboardInterrupt")


def _held_log(text: str) -> Path:
    """The log the report names, and the line it says the stop's output starts at."""
    found = re.search(
        r"the job's output after pitstop stopped it:\s+(/\S+job-output\.log) \(from line (\d+)\)", text
    )
    assert found is not None, text[-4000:]
    log = Path(found[1])
    assert log.is_file()
    lines = log.read_text(errors="replace").splitlines()
    after = "\n".join(lines[int(found[2]) - 1 :])
    assert "KeyboardInterrupt" in after  # the job's reaction to the stop is kept, after the line named
    return log


def test_off_a_terminal_no_traceback_and_pitstop_lines_start_a_line() -> None:
    proc = run_pitstop(*DOCTOR, *JOB, env={"COLUMNS": "200"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    shown = proc.stdout + proc.stderr
    for alarm in ALARMS:
        assert alarm not in shown, shown[-4000:]
    assert "it/s]" in proc.stderr or "s/it]" in proc.stderr  # the job's own tqdm bar was relayed
    ours = [m.start() for m in re.finditer(r"pitstop( doctor)?: ", proc.stderr)]
    assert len(ours) >= 2, proc.stderr[-4000:]  # the small windows' lines and the probe's stop line
    for at in ours:
        assert at == 0 or proc.stderr[at - 1] == "\n", repr(proc.stderr[max(0, at - 80) : at + 40])
    log = _held_log(shown)
    assert "'loss'" in log.read_text()  # the log holds the job's output from its start too
    log.unlink()
    log.parent.rmdir()


def _run_in_pty(args: list[str], timeout: float = 600) -> tuple[int, str]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    env = {**os.environ, "COLUMNS": "200", "TERM": "xterm-256color"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pitstop", *args], stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, env=env
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.5)[0]:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    code = proc.wait(timeout=30)
    os.close(master)
    return code, b"".join(chunks).decode("utf-8", errors="replace")


def test_on_a_terminal_no_traceback_and_the_report_names_the_log() -> None:
    code, shown = _run_in_pty([*DOCTOR, *JOB])
    assert code == 0, shown[-4000:]
    for alarm in ALARMS:
        assert alarm not in shown, shown[-4000:]
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown).replace("\r\n", "\n")
    assert "'loss'" in plain  # the job's lines before the stop are shown above the panel
    log = _held_log(plain)
    log.unlink()
    log.parent.rmdir()
