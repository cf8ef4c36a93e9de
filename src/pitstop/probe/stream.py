"""The rank file: what one probed process has measured so far, one JSON object a line, written as it happens.

Why lines, flushed one by one: the job can die at any moment (the OOM killer's SIGKILL, a segfault, a SIGTERM
from a scheduler) and no code of the probe runs then. Every complete line is already in the kernel's hands, so
the runner reads whatever was measured up to the death. A process that finishes cleanly ends its file with
one ``profile`` line holding the whole RankProfile, which then wins over the lines before it.

This module is the file: where it lies, the writer (``RankStream``) and the end-of-job read. What a line holds,
how it is written and read back is the codec's, ``probe/rankfile.py``, shared with the live follower
(``runner/follow.py``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import IO, Any

from pitstop.core.profile import RankProfile
from pitstop.probe.rankfile import line, read_text

PATTERN = "rank-*.jsonl"


def stream_path(out_dir: Path, pid: int) -> Path:
    return out_dir / f"rank-{pid}.jsonl"


class RankStream:
    """Appends lines to this process's rank file, each flushed at once. Opened on the first line, so a
    process that never measures anything (a DataLoader worker) leaves no file; a forked child that does
    measure (a trainer started by fork) writes a file of its own, never into its parent's."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self._pid = os.getpid()
        self._file: IO[str] | None = None
        self._lock = threading.Lock()

    def write(self, kind: str, **payload: Any) -> None:
        text = line(kind, **payload)
        with self._lock:
            if os.getpid() != self._pid:  # forked: the inherited file is the parent's
                self._pid, self._file = os.getpid(), None
            if self._file is None:
                self._file = open(stream_path(self.out_dir, self._pid), "a", encoding="utf-8")  # noqa: SIM115
            self._file.write(text)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None and os.getpid() == self._pid:
                self._file.close()
            self._file = None

    @property
    def pid(self) -> int:
        return self._pid


def read_stream(path: Path) -> tuple[RankProfile, bool] | None:
    """The RankProfile a rank file holds and whether the process finished it (False: it died first and
    this is rebuilt from its lines). A line cut short by the death, or damaged, is skipped."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return read_text(text)
