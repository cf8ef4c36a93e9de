"""``pitstop doctor``'s live view on a real CPU training: plain lines per small window when the output is not a
terminal (what CI logs keep), and the panel redrawn in place on a pseudo-terminal, the job's lines above it."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, SCRIPTS, run_pitstop

pytestmark = pytest.mark.slow

LOOP = [sys.executable, str(SCRIPTS / "plain_loop.py"), "--threads", "1", "--batch", "4", "--packed"]
ARGS = ["doctor", "--no-history", "--warmup", "3", "--steps", "20", "--"]


def test_off_a_terminal_each_small_window_is_one_line() -> None:
    proc = run_pitstop(*ARGS, *LOOP, "--steps", "60")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("pitstop doctor: steps ")]
    assert len(lines) == 5, proc.stderr  # 20 measured steps in windows of 4
    assert all("tokens/s" in line and "data wait" in line and "top:" in line for line in lines)
    assert "\x1b[" not in proc.stderr  # no escape codes in a log


def _run_in_pty(args: list[str], timeout: float = 300) -> str:
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "100", "TERM": "xterm-256color"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pitstop", *args], stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, env=env
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the other side closed: the process is gone
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(timeout=30)
    os.close(master)
    assert proc.returncode == 0
    return b"".join(chunks).decode("utf-8", errors="replace")


def test_on_a_terminal_the_panel_is_redrawn_below_the_jobs_output() -> None:
    job = "echo hello from the job; exec " + " ".join([*LOOP, "--steps", "60"])
    text = _run_in_pty([*ARGS, "bash", "-c", job])
    assert "pitstop doctor" in text and "over the window" in text and "top finding" in text
    assert "\x1b[2K" in text or "\x1b[1A" in text  # the panel is erased and drawn again, in place
    assert "pitstop doctor: steps " not in text  # no plain lines on a terminal
    assert "hello from the job" in text  # the job's own lines still show, above the panel
