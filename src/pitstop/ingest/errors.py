"""The one error the ingest layer raises: a message fit for one line, about one file."""

from __future__ import annotations


class IngestError(Exception):
    """An artifact cannot be read at all (as opposed to read with a stated limitation)."""
