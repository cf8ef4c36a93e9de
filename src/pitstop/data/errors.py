"""The one error the data layer raises: a one-line message that names the file, the line or the cache."""

from __future__ import annotations

from pitstop.errors import PitstopError


class DataError(PitstopError):
    """Examples, a tokenizer or a cache cannot be used as asked."""
