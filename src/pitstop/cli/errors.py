"""The one exception the CLI turns into a one-line message and an exit code."""

from __future__ import annotations


class UserError(Exception):
    """Bad input, or an outcome to report in one line, with the exit code to leave with."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code
