"""Files the data layer opens for reading are regular files, checked before the open.

``pitstop.regular``'s rule, as a ``DataError``: a FIFO named ``meta.json``, ``tokenizer.json`` or a data file
would block the open forever, and a device (``/dev/zero``) never ends, so each is one ``DataError`` naming the
file and what it is, and nothing is opened.
"""

from __future__ import annotations

import os
from pathlib import Path

from pitstop.data.errors import DataError
from pitstop.regular import regular_problem as file_problem
from pitstop.regular import regular_stat


def regular_problem(path: Path) -> str | None:
    """Why ``path`` (links followed) is not a file to open for reading, in one line naming it, or ``None``
    (a missing file is ``None``: the caller says what missing means; an empty file is the data's business)."""
    return file_problem(path, empty_ok=True)


def check_regular(path: Path) -> os.stat_result:
    """The status of ``path``, a regular file, or a one-line ``DataError`` (missing included)."""
    return regular_stat(path, DataError, empty_ok=True)
