"""The job's uncaught exception: which, where in the job's own code, and at which step.

A job that crashes leaves a traceback on its stderr and an exit code; the runner sees only the code. Here
``sys.excepthook`` and ``threading.excepthook`` are wrapped from the probe's installation on, each handing the
exception on to the hook that was there first, so the job prints the same traceback and exits with the same
code. The exception is written to the rank file at once (a ``failure`` line: Python calls the hook before the
``atexit`` handlers, so the probe's closing profile carries it too) and filled into the rank's profile.

Under the runner the hooks stay for the process's life (a job that fails after its window must still say
how); in a process without a rank file (``pitstop.watch``, a callback) they are put back with the probe's.
An interruption (``KeyboardInterrupt``: Ctrl-C, or pitstop's own stop after the window) is not a failure: the
runner tells it.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

from pitstop.core.profile import JobFailure, RankProfile, to_jsonable
from pitstop.frames import PITSTOP_DIR
from pitstop.probe.collectors.base import Collector, Emit, ProbeContext, collector
from pitstop.probe.rankfile import Kind

MESSAGE_CHARS = 2000  # an exception's message kept, at most (a CUDA out-of-memory message runs long)
LIBRARY_PARTS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


def _library_dirs() -> tuple[str, ...]:
    """The standard library's folders: a frame there is no line of the job's."""
    paths = sysconfig.get_paths()
    return tuple({os.path.join(paths[k], "") for k in ("stdlib", "platstdlib") if paths.get(k)})


def _is_jobs(filename: str, library_dirs: tuple[str, ...]) -> bool:
    return not (
        filename.startswith((PITSTOP_DIR, "<", *library_dirs)) or any(p in filename for p in LIBRARY_PARTS)
    )


def raise_site(tb: TracebackType | None) -> str | None:
    """``"path:line"`` of the innermost frame of the traceback in the job's own code (not pitstop's, an
    installed package's or the standard library's); the innermost frame of all when none is the job's."""
    frames = list(traceback.walk_tb(tb))
    if not frames:
        return None
    library_dirs = _library_dirs()
    for frame, line in reversed(frames):
        if _is_jobs(frame.f_code.co_filename, library_dirs):
            return f"{frame.f_code.co_filename}:{line}"
    frame, line = frames[-1]
    return f"{frame.f_code.co_filename}:{line}"


def failure_of(
    value: BaseException,
    tb: TracebackType | None,
    step: int | None,
    rank: int | None,
    thread: str | None = None,
) -> JobFailure:
    """The record of one uncaught exception."""
    try:
        message = str(value)
    except Exception:  # a broken __str__ must not lose the record
        message = ""
    return JobFailure(
        exception=type(value).__qualname__,
        message=message[:MESSAGE_CHARS] or None,
        site=raise_site(tb),
        step=step,
        rank=rank,
        thread=thread,
        at=time.time(),
    )


@collector
class FailureCollector(Collector):
    """Wraps the exception hooks; the probe hands it the rank file's writer and the step (``attach``)."""

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.failure: JobFailure | None = None
        self._emit: Emit | None = None
        self._step: Callable[[], int | None] = lambda: None
        self._pid = os.getpid()
        self._sys_hook: Callable[..., Any] | None = None
        self._thread_hook: Callable[..., Any] | None = None

    def attach(self, emit: Emit, step: Callable[[], int | None]) -> None:
        """Where a failure is written as it happens, and how the step it ended is read."""
        self._emit, self._step = emit, step

    def install(self) -> None:
        if self._sys_hook is not None:
            return
        self._pid = os.getpid()
        self._sys_hook, self._thread_hook = sys.excepthook, threading.excepthook
        sys.excepthook = self._on_uncaught
        threading.excepthook = self._on_thread

    def remove(self) -> None:
        if self.ctx.config.out_dir is not None:  # under the runner: a failure after the window is told too
            return
        if sys.excepthook == self._on_uncaught and self._sys_hook is not None:
            sys.excepthook = self._sys_hook
        if threading.excepthook == self._on_thread and self._thread_hook is not None:
            threading.excepthook = self._thread_hook
        self._sys_hook = self._thread_hook = None

    def _on_uncaught(self, kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        self._note(value, tb, None)
        (self._sys_hook or sys.__excepthook__)(kind, value, tb)

    def _on_thread(self, args: Any) -> None:
        thread = getattr(args.thread, "name", None) or "a thread"
        self._note(args.exc_value, args.exc_traceback, thread)
        (self._thread_hook or threading.__excepthook__)(args)

    def _note(self, value: BaseException | None, tb: TracebackType | None, thread: str | None) -> None:
        """Record the exception (the main thread's over a thread's, else the first); never raises."""
        try:
            if value is None or isinstance(value, KeyboardInterrupt) or os.getpid() != self._pid:
                return  # an interruption is the runner's to tell; a forked worker is not the job's process
            if self.failure is not None and (thread is not None or self.failure.thread is None):
                return
            rank = int(os.environ.get("RANK", "0") or 0)
            self.failure = failure_of(value, tb, self._step(), rank, thread)
            if self._emit is not None:
                self._emit(Kind.FAILURE, failure=to_jsonable(self.failure))
        except Exception:  # the job's own hook still runs: its traceback and exit code are unchanged
            return

    def fill(self, draft: RankProfile) -> None:
        draft.failure = self.failure
