"""The one base of every error pitstop raises on purpose: a message fit for one line, and an exit code.

The CLI turns any ``PitstopError`` into that line on stderr and leaves with ``code`` (2: bad input). Anything
else that escapes is a bug and is reported as an internal error.
"""

from __future__ import annotations


class PitstopError(Exception):
    """An outcome to report in one line (bad input, a refused file, a job that cannot be measured)."""

    code: int = 2

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
