"""Issue 42, item 8: ``pitstop doctor`` on the newcomer's Trainer job (``tests/scripts/newcomer_trainer.py``)
shows no traceback when it stops the job after its window. The job's output from the stop on (its
``KeyboardInterrupt``) is in a log file the report names; pitstop's own lines start at the left edge even
while the job's tqdm bar leaves its line open.

On a pseudo-terminal (the panel view) and off one (plain lines on the stream the job's bar is drawn on)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_in_pty, run_pitstop

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


def test_on_a_terminal_no_traceback_and_the_report_names_the_log() -> None:
    env = {**os.environ, "COLUMNS": "200", "TERM": "xterm-256color"}
    code, shown = run_in_pty(
        [sys.executable, "-m", "pitstop", *DOCTOR, *JOB], rows=40, columns=200, timeout=600, env=env
    )
    assert code == 0, shown[-4000:]
    for alarm in ALARMS:
        assert alarm not in shown, shown[-4000:]
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown).replace("\r\n", "\n")
    assert "'loss'" in plain  # the job's lines before the stop are shown above the panel
    log = _held_log(plain)
    log.unlink()
    log.parent.rmdir()
