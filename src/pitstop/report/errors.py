"""The one error the renderers raise: a document they cannot render, or a writer that is not installed."""

from __future__ import annotations

from pitstop.errors import PitstopError


class ReportError(PitstopError, ValueError):
    """The document is not one pitstop can render (or the output's writer is missing)."""
