"""The one exception the CLI turns into a one-line message and an exit code."""

from __future__ import annotations

from pitstop.errors import PitstopError


class UserError(PitstopError):
    """Bad input on the command line, or an outcome to report in one line, with the exit code."""
