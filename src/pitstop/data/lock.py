"""One builder per cache: an exclusive lock on ``<key>.lock`` that the kernel drops when its owner dies.

The file holds the owner's pid (to tell a waiting user whom it waits for). A lock left by a killed build is
never stale in the way a pid file is: the kernel released it with the process, so the next build takes it
at once. The owner unlinks the file before letting go, so a waiter that got the lock on the unlinked file
sees the name now points elsewhere (or nowhere) and tries again on the current one.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from pitstop.data import fsops
from pitstop.data.errors import DataError
from pitstop.data.regular import regular_problem

if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _try(fd: int) -> bool:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def _wait(fd: int) -> None:
        while not _try(fd):
            time.sleep(0.1)

else:
    import fcntl

    def _try(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _wait(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)


def _owner(fd: int) -> int | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 32).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class BuildLock:
    """``with BuildLock(path, on_wait):`` holds the lock; ``on_wait(pid)`` is called once if another has it."""

    def __init__(self, path: Path, on_wait: Callable[[int | None], None] | None = None) -> None:
        self.path = path
        self.on_wait = on_wait
        self._fd: int | None = None

    def __enter__(self) -> BuildLock:
        told = False
        while True:
            problem = regular_problem(self.path)
            if problem is not None:  # a FIFO or device there: the lock is a file of the build's own
                raise DataError(f"{problem}; remove it to build this cache")
            existed = self.path.exists()
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if not existed:
                    fsops.step()
                if not _try(fd):
                    if self.on_wait is not None and not told:
                        self.on_wait(_owner(fd))
                        told = True
                    _wait(fd)
                mine = os.fstat(fd)
                try:
                    now = os.stat(self.path)
                except FileNotFoundError:
                    now = None
                if now is None or (now.st_ino, now.st_dev) != (mine.st_ino, mine.st_dev):
                    os.close(fd)  # the previous owner removed this file on its way out: take the new one
                    continue
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                os.write(fd, f"{os.getpid()}\n".encode())
                fsops.step()
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._fd is None:
            return
        try:
            fsops.unlink(self.path)  # while still holding it: see the module's docstring
        except OSError:
            pass  # Windows keeps an open file's name; a leftover unlocked file is harmless
        finally:
            os.close(self._fd)
            self._fd = None
