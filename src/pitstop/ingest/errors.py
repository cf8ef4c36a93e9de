"""The one error the ingest layer raises: a message fit for one line, about one file."""

from __future__ import annotations

from pitstop.errors import PitstopError


class IngestError(PitstopError):
    """An artifact cannot be read at all (as opposed to read with a stated limitation)."""
