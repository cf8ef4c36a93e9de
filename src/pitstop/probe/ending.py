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

A rank whose probe disabled itself (an internal error) will never write its window: it leaves a marker
saying so (:func:`leave_lost_marker`), and the runner stops the job at once (:func:`lost_probes`) rather
than wait on a window that cannot come; one lost rank of several is enough, since the run's window needs
them all.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pitstop.probe.config import ENV_OUT

MARKER = "window-done-"  # + the process id: one per rank whose window is written
# in the run folder: b"0" while the job's output shown on pitstop's stderr ends inside a line (a tqdm bar
# redrawn with \r), written by the runner's relay (``runner.relay``)
LINE_STATE = ".job-output-line"
LOST = "probe-lost-"  # + the process id: one per rank whose probe disabled itself
WAIT_FOR_RANKS_S = 20.0  # the longest the runner waits for the other ranks once one has written its window
ALONE_AFTER_S = 60.0  # a rank no runner stopped by then interrupts itself (SIGINT, then SIGTERM)
ALONE_GRACE_S = 10.0


def end_the_job(announce: bool, steps: int) -> None:
    """The rank file is complete: say so to the runner, which stops the job like Ctrl-C. Returns at once (the
    job runs on until the runner's SIGINT); a rank no runner stops interrupts itself later."""
    out = os.environ.get(ENV_OUT)
    if announce:
        print(f"{fresh_line()}pitstop: measured {steps} steps; stopping the run", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    if out:
        _leave_marker(Path(out))
    timer = threading.Thread(target=_interrupt_myself, name="pitstop-window-end", daemon=True)
    timer.start()


def fresh_line() -> str:
    """What a line the probe prints on the job's stderr starts with: a newline where the job's output shown so
    far left its line open (a tqdm bar redrawn with \\r), so the line is not glued onto the bar."""
    sys.stderr.flush()
    out = os.environ.get(ENV_OUT)
    if out:
        with contextlib.suppress(OSError), open(Path(out) / LINE_STATE, "rb") as f:
            return "\n" if f.read(1) == b"0" else ""
    return ""


def _leave_marker(out: Path, name: str = MARKER, **extra: str) -> None:
    rank = _env_int("RANK", 0)
    ranks_here = _env_int("LOCAL_WORLD_SIZE", 0) or _env_int("WORLD_SIZE", 1)
    with contextlib.suppress(OSError):
        temp = out / f".{name}{os.getpid()}"
        temp.write_text(json.dumps({"rank": rank, "ranks_here": ranks_here, **extra}))
        temp.replace(out / f"{name}{os.getpid()}")  # whole or absent: the runner never reads half of it


def leave_lost_marker(out: Path, error: str) -> None:
    """This rank's probe disabled itself after ``error``: tell the runner, which ends the job. Never raises."""
    _leave_marker(out, LOST, error=error)


@dataclass(frozen=True)
class ProbeLost:
    """The ranks of this node whose probe disabled itself, and the first one's error."""

    ranks: list[int]
    ranks_here: int
    error: str

    @property
    def where(self) -> str:
        """Where, for the one line: ' on rank 1 of 2' for a job of several ranks, nothing for one."""
        if self.ranks_here <= 1 and self.ranks == [0]:
            return ""
        if len(self.ranks) >= self.ranks_here:
            return f" on every rank ({', '.join(map(str, self.ranks))})"
        which = "rank" if len(self.ranks) == 1 else "ranks"
        return f" on {which} {', '.join(map(str, self.ranks))} of {self.ranks_here}"


def lost_probes(out: Path) -> ProbeLost | None:
    """The ranks whose probe is lost, None while every probe still works."""
    seen: dict[int, tuple[float, str]] = {}
    expected = 1
    for path in out.glob(f"{LOST}*"):
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            found = json.loads(path.read_text())
            expected = max(expected, int(found["ranks_here"]))
            seen.setdefault(int(found["rank"]), (path.stat().st_mtime, str(found["error"])))
    if not seen:
        return None
    first = min(seen.values())[1]
    return ProbeLost(sorted(seen), expected, first)


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
