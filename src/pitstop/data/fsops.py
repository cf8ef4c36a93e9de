"""Every filesystem change a cache build makes, in one place, so a test can kill the build after any one.

A build must survive a kill at any instant; the claim is only worth what its test covers, and the test
covers exactly the operations listed here: creating a file, each write into it, a rename, an unlink, a
directory made or removed. ``kill_after`` (set by that test in a child process, never in normal use) makes
the process SIGKILL itself right after the n-th operation; ``count`` says how many a build made.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

count = 0
kill_after: int | None = None


def step() -> None:
    """One filesystem change is done: the place where an injected kill lands."""
    global count
    count += 1
    if kill_after is not None and count >= kill_after:
        os.kill(os.getpid(), signal.SIGKILL)


class Writer:
    """A file being written: each ``write`` is one step; closing flushes it to the disk."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f

    def write(self, data: bytes | memoryview) -> None:
        self._f.write(data)
        self._f.flush()
        step()


@contextmanager
def create(path: Path) -> Iterator[Writer]:
    """Create (or truncate) ``path``; its data reaches the disk (fsync) before the block ends."""
    with path.open("wb") as f:
        step()
        yield Writer(f)
        f.flush()
        os.fsync(f.fileno())


def write_file(path: Path, *parts: bytes | memoryview) -> None:
    with create(path) as w:
        for part in parts:
            w.write(part)


def rename(src: Path, dst: Path) -> None:
    os.replace(src, dst)
    step()


def unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        return
    step()


def mkdir(path: Path) -> None:
    try:
        path.mkdir()
    except FileExistsError:
        return
    step()


def remove_tree(path: Path) -> None:
    """``rm -r``, one step per entry: a kill may stop it anywhere, and running it again finishes it."""
    if not path.is_dir() or path.is_symlink():
        unlink(path)
        return
    for entry in sorted(path.iterdir()):
        remove_tree(entry)
    try:
        path.rmdir()
    except FileNotFoundError:
        return
    step()


def sync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (a power cut, not only a kill); a no-op where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
