"""Files pitstop opens for reading are regular files, checked before the open: a FIFO would block the open
forever and a device (``/dev/zero``) never ends. One rule for every layer that reads (the data layer, the
artifact readers, the history); each turns the message into its own error type."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def file_type(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def regular_problem(path: Path, *, empty_ok: bool = False) -> str | None:
    """Why ``path`` (links followed) is not a file pitstop may open for reading, as a one-line message
    naming it, or ``None``. A missing file is ``None`` here (the caller decides what missing means); an empty
    one is a problem unless ``empty_ok`` (pseudo-files of /proc and /sys report 0 bytes and may block)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: cannot open ({exc.strerror or exc})"
    if not stat.S_ISREG(info.st_mode):
        return f"{path}: {file_type(info.st_mode)}, not a file pitstop reads"
    if info.st_size == 0 and not empty_ok:
        return f"{path}: empty file (or a pseudo-file of /proc or /sys, which reports 0 bytes)"
    return None


def regular_stat(path: Path, error: type[Exception], *, empty_ok: bool = False) -> os.stat_result:
    """The status of ``path``, a regular file, or ``error`` with the one-line reason (missing included): each
    reading layer passes its own error type."""
    problem = regular_problem(path, empty_ok=empty_ok)
    if problem is not None:
        raise error(problem)
    try:
        return path.stat()
    except OSError as exc:
        raise error(f"{path}: cannot open ({exc.strerror or exc})") from None
