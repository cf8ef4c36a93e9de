"""Ending the observed job once its measurement window is written (zero-code runner only).

The job is stopped the way the user's own Ctrl-C would stop it, so that its ``finally:`` blocks and ``atexit``
handlers run (a server it started is ended, its files are closed, a checkpoint it saves on interrupt is
saved). A rank does not interrupt itself: under torchrun the ranks finish their windows a step or so apart,
and the first to leave would take the others down before their rank files are written. Each rank leaves a
marker once its window is written (:func:`end_the_job`) and goes on training; the runner, which sees the
markers, sends SIGINT to the job's process group once every rank of this node has left one
(:func:`window_written`), as a terminal does, and escalates to SIGTERM / SIGKILL for a job that ignores it.

Where no runner watches this process (a rank on another node that a launcher started with pitstop's
environment), the rank interrupts itself after :data:`ALONE_AFTER_S`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from pitstop.probe.config import ENV_OUT

MARKER = "window-done-"  # + the process id: one per rank whose window is written
WAIT_FOR_RANKS_S = 20.0  # the longest the runner waits for the other ranks once one has written its window
ALONE_AFTER_S = 60.0  # a rank no runner stopped by then interrupts itself (SIGINT, then SIGTERM)
ALONE_GRACE_S = 10.0


def end_the_job(announce: bool, steps: int) -> None:
    """The rank file is complete: say so to the runner, which stops the job like Ctrl-C. Returns at once (the
    job runs on until the runner's SIGINT); a rank no runner stops interrupts itself later."""
    if announce:
        print(f"pitstop: measured {steps} steps; stopping the run", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    out = os.environ.get(ENV_OUT)
    if out:
        _leave_marker(Path(out))
    timer = threading.Thread(target=_interrupt_myself, name="pitstop-window-end", daemon=True)
    timer.start()


def _leave_marker(out: Path) -> None:
    rank = _env_int("RANK", 0)
    ranks_here = _env_int("LOCAL_WORLD_SIZE", 0) or _env_int("WORLD_SIZE", 1)
    with contextlib.suppress(OSError):
        temp = out / f".{MARKER}{os.getpid()}"
        temp.write_text(json.dumps({"rank": rank, "ranks_here": ranks_here}))
        temp.replace(out / f"{MARKER}{os.getpid()}")  # whole or absent: the runner never reads half of it


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "") or default)
    except ValueError:
        return default


def _interrupt_myself() -> None:
    """The fallback when no runner interrupts this process: Ctrl-C itself, then SIGTERM after a grace."""
    time.sleep(ALONE_AFTER_S)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(ALONE_GRACE_S)
    os.kill(os.getpid(), signal.SIGTERM)


def window_written(out: Path) -> bool:
    """Whether the job can be stopped: every rank of this node wrote its window, or one did and the others
    have not within :data:`WAIT_FOR_RANKS_S` (a rank without a probe, a rank stuck in a collective)."""
    ranks: set[int] = set()
    expected = 1
    first: float | None = None
    for path in out.glob(f"{MARKER}*"):
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            seen = json.loads(path.read_text())
            ranks.add(int(seen["rank"]))
            expected = max(expected, int(seen["ranks_here"]))
            written = path.stat().st_mtime
            first = written if first is None else min(first, written)
    if first is None:
        return False
    return len(ranks) >= expected or time.time() - first > WAIT_FOR_RANKS_S
