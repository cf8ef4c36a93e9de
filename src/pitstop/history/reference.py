"""A one-rank reference for a multi-rank run's scaling efficiency, from the history.

The reference is the newest ``doctor`` run whose fingerprint equals this run's with ``world_size`` set to 1:
the same model, device, sequence length, per-rank micro-batch and accumulation, on one rank; never a run whose
job failed.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from pitstop.history.errors import HistoryError
from pitstop.history.fingerprint import fingerprint_fields, fingerprint_of
from pitstop.history.store import open_store


def single_rank_reference(doc: dict[str, Any], path: Path | None) -> tuple[float, str] | None:
    """(real tokens/s, where it came from) of a comparable one-rank run, or None when the history has none."""
    fields = fingerprint_fields(doc)
    if (fields.get("world_size") or 1) <= 1:
        return None
    wanted = fingerprint_of({**fields, "world_size": 1})
    try:
        with open_store(path, create=False) as store:
            record = store.latest(kind="doctor", fingerprint=wanted, include_failed=False)
    except (HistoryError, OSError, RuntimeError, sqlite3.Error):
        return None
    if record is None or not record.real_tokens_per_s:
        return None
    return record.real_tokens_per_s, f"history run {record.id}: the same job on 1 rank ({record.created_at})"
