"""`pitstop watch` reports a change while the job still runs: the rank files are tailed as they grow, not read
at the job's end. The job here would run for hours; the change line must arrive while it is alive, and Ctrl-C
then ends both with the change kept in the JSON."""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import SCRIPTS, start_as_at_a_terminal

pytestmark = pytest.mark.slow

LOOP = [sys.executable, str(SCRIPTS / "plain_loop.py"), "--threads", "1", "--batch", "4", "--packed"]


def test_a_change_is_reported_while_the_job_runs(tmp_path: Path) -> None:
    out = tmp_path / "watch.json"
    env = {**os.environ, "PITSTOP_CACHE": str(tmp_path / "cache"), "COLUMNS": "120", "PYTHONUNBUFFERED": "1"}
    # --min-drop 0.5: the planted drop is 80-85%; the machine's own moves (a first window half as fast as the
    # rest, a burst of load) are changes too at the default 10%, and this test is about the one planted
    cmd = [sys.executable, "-m", "pitstop", "watch", "--window-steps", "40", "--warmup", "5", "--no-history"]
    cmd += ["--min-drop", "0.5"]
    cmd += [
        "--json",
        str(out),
        "--",
        *LOOP,
        "--steps",
        "1000000",
        "--slow-after",
        "170",
        "--slow-after-ms",
        "40",
    ]
    proc = start_as_at_a_terminal(cmd, env, merge_stderr=True)
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []
    job_alive_at_change = False
    deadline = time.monotonic() + 300  # the change shows by step ~250: about 20 s on this machine
    try:
        assert proc.stdout is not None
        # read in a thread: a watch that prints nothing must not block the test past its deadline
        stdout = proc.stdout

        def read() -> None:
            for line in stdout:
                lines.put(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                break
            seen.append(line)
            if "CHANGE (slower)" in line:
                children = psutil.Process(proc.pid).children(recursive=True)
                job_alive_at_change = any("plain_loop.py" in " ".join(c.cmdline()) for c in children)
                break
        assert job_alive_at_change, "".join(seen[:12]) + " …\n" + "".join(seen)[-2000:]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        reader.join(timeout=30)  # the pipe closed with the process: the reader ends
        rest = "".join(lines.get() for _ in range(lines.qsize()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, rest[-2000:]
    changes = json.loads(out.read_text())["watch"]["changes"]
    slower = [c for c in changes if c["kind"] == "slower"]
    assert slower and 165 <= slower[0]["step"] <= 175 and slower[0]["part"] == "data_wait_s"
