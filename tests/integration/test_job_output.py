"""The job's output relayed through pitstop (``runner.relay``): shown until pitstop stops the job, kept whole in
a log; a pseudo-terminal for the job where pitstop's stream is one; pitstop's lines on a line of their own.

The runs here start a small Python job (no torch: the probe does not arm) and stop it at its ``--timeout``,
one of pitstop's own stops, in a harness process whose stdout and stderr are pipes or a pseudo-terminal."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_in_pty

pytestmark = pytest.mark.slow  # each starts pitstop's runner and a job

# the job: a line, a tqdm-like bar left open, whether its streams are terminals and how wide; then it waits
# for pitstop's stop and answers it with a traceback, as a Trainer does
JOB = textwrap.dedent(
    """
    import os, sys, time
    print("before the stop", flush=True)
    size = os.get_terminal_size(1).columns if os.isatty(1) else 0
    print(f"job streams: tty={os.isatty(1)},{os.isatty(2)} columns={size}", flush=True)
    sys.stderr.write("\\r 10%|#         | 1/10"); sys.stderr.flush()
    try:
        time.sleep(60)
    except KeyboardInterrupt:
        print("AFTER THE STOP", flush=True)
        raise
    """
)

# the harness: pitstop's runner on the job, stopped at a 2 s timeout; what it learnt goes to a file
HARNESS = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from pitstop.probe.config import ProbeConfig
    from pitstop.runner.launch import run_observed
    out, job = Path(sys.argv[1]), sys.argv[2]
    launch = run_observed([sys.executable, "-c", job], ProbeConfig(), out_dir=out / "run",
                          timeout_s=2.0, output_log=out / "job.log")
    sys.stderr.write("PITSTOP LINE\\n")
    (out / "launch.json").write_text(json.dumps({"cut": launch.output_cut, "log": str(launch.log_path),
                                                 "stopped_by": launch.stopped_by}))
    """
)


def _harness(tmp_path: Path) -> list[str]:
    return [sys.executable, "-c", HARNESS, str(tmp_path), JOB]


def _launch(tmp_path: Path) -> dict[str, object]:
    found: dict[str, object] = json.loads((tmp_path / "launch.json").read_text())
    return found


def test_the_stop_s_traceback_goes_to_the_log_alone(tmp_path: Path) -> None:
    proc = subprocess.run(
        _harness(tmp_path), capture_output=True, text=True, cwd=ROOT, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    launch = _launch(tmp_path)
    assert launch["stopped_by"] == "timeout"
    shown = proc.stdout + proc.stderr
    assert "before the stop" in proc.stdout and "tty=False,False" in proc.stdout  # pipes stay pipes
    assert "AFTER THE STOP" not in shown and "Traceback" not in shown and "KeyboardInterrupt" not in shown
    log = (tmp_path / "job.log").read_text()
    assert "before the stop" in log and "AFTER THE STOP" in log  # the whole output, the stop's part too
    assert "Traceback" in log and "KeyboardInterrupt" in log
    cut = launch["cut"]
    assert isinstance(cut, int) and "AFTER THE STOP" in log[cut:] and "before the stop" in log[:cut]
    # the open bar was closed on pitstop's stderr before pitstop's own line
    assert "1/10\nPITSTOP LINE" in proc.stderr


def test_on_a_terminal_the_job_writes_to_a_terminal_and_the_stop_stays_off_it(tmp_path: Path) -> None:
    code, shown = run_in_pty(_harness(tmp_path), rows=30, columns=100, timeout=60)  # a 100-column terminal
    assert code == 0, shown
    assert "before the stop" in shown
    assert "tty=True,True columns=100" in shown  # a pseudo-terminal as wide as pitstop's terminal
    assert "AFTER THE STOP" not in shown and "Traceback" not in shown
    log = (tmp_path / "job.log").read_bytes()
    assert b"AFTER THE STOP" in log and b"KeyboardInterrupt" in log
    assert b"\r\n" not in log.replace(b"\r 10%", b"")  # the job's bytes, not the line discipline's
    assert "PITSTOP LINE" in shown
    before = shown.split("PITSTOP LINE")[0]
    assert before.endswith("\n")  # pitstop's line starts at the left edge, not after the open bar


# pitstop killed (SIGKILL: no clean-up) while the job runs: the job's last words, written after pitstop is
# gone (its parent-death SIGINT), still reach the log through the relay
DYING_HARNESS = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from pathlib import Path
    from pitstop.probe.config import ProbeConfig
    from pitstop.runner.launch import run_observed
    out, job = Path(sys.argv[1]), sys.argv[2]
    def die():
        log = out / "job.log"
        while not (log.exists() and "before the stop" in log.read_text(errors="replace")):
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=die, daemon=True).start()
    run_observed([sys.executable, "-c", job], ProbeConfig(), out_dir=out / "run", output_log=out / "job.log")
    """
)


def test_the_log_is_complete_when_pitstop_dies(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", DYING_HARNESS, str(tmp_path), JOB],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -9, proc.stderr  # pitstop died without a chance to clean up
    log = tmp_path / "job.log"
    deadline = time.monotonic() + 30  # the reaper's grace at most: the job ends on its parent-death SIGINT
    while time.monotonic() < deadline and "AFTER THE STOP" not in log.read_text(errors="replace"):
        time.sleep(0.2)
    text = log.read_text(errors="replace")
    assert "before the stop" in text and "AFTER THE STOP" in text and "KeyboardInterrupt" in text
