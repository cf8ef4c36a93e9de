"""Files the data layer opens for reading are regular files, checked before the open.

The same rule as ``pitstop.ingest.readers.regular_problem`` (which this layer sits below and cannot import):
a FIFO named ``meta.json``, ``tokenizer.json`` or a data file would block the open forever, and a device
(``/dev/zero``) never ends, so each is one ``DataError`` naming the file and what it is, and nothing is
opened.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pitstop.data.errors import DataError


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def regular_problem(path: Path) -> str | None:
    """Why ``path`` (links followed) is not a file to open for reading, in one line naming it, or ``None``
    (a missing file is ``None``: the caller says what missing means)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: cannot open ({exc.strerror or exc})"
    if not stat.S_ISREG(mode):
        return f"{path}: {_kind(mode)}, not a file pitstop reads"
    return None


def check_regular(path: Path) -> os.stat_result:
    """The status of ``path``, a regular file, or a one-line ``DataError`` (missing included)."""
    problem = regular_problem(path)
    if problem is not None:
        raise DataError(problem)
    try:
        return path.stat()
    except OSError as exc:
        raise DataError(f"{path}: cannot open ({exc.strerror or exc})") from None
