"""The one error the history raises: a one-line message that names the file."""

from __future__ import annotations

from pitstop.errors import PitstopError


class HistoryError(PitstopError, ValueError):
    """The history file cannot be used (not ours, corrupt, too new) or a request about it is wrong."""
