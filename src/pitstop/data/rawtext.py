"""Telling raw examples (text still to be tokenized) from token ids, without importing torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "dtype") and hasattr(x, "shape") and hasattr(x, "numel")


def looks_like_text(samples: Any) -> bool:
    """Whether raw examples (what a collate function receives) are still text, to be tokenized per batch."""
    if not isinstance(samples, list | tuple) or not samples:
        return False
    first = samples[0]
    if isinstance(first, str | bytes):
        return True
    if isinstance(first, Mapping):
        values = list(first.values())
        has_text = any(isinstance(v, str) and len(v) > 0 for v in values)
        has_ids = any(_is_tensor(v) or (isinstance(v, list) and v and isinstance(v[0], int)) for v in values)
        return has_text and not has_ids
    if isinstance(first, list | tuple):
        return any(isinstance(v, str) for v in first)
    return False
