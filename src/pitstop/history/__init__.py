"""``pitstop history``: every measured result kept in SQLite, so a slower run is caught.

``record`` stores a ``pitstop.run/1`` or ``pitstop.tune/1`` document; runs with the same fingerprint (model,
hardware, sequence length, batch) are comparable whatever their library versions, and ``check`` flags a drop
against a baseline, naming the versions that changed (``upgrade.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pitstop.history.compare import (
    Comparison,
    MetricRow,
    Verdict,
    check,
    compare_runs,
    find_baseline,
    fingerprint_diff,
    metric_rows,
    parse_max_drop,
    slowdown,
)
from pitstop.history.documents import summarize
from pitstop.history.errors import HistoryError
from pitstop.history.fingerprint import fingerprint, fingerprint_fields
from pitstop.history.gitinfo import git_head, resolve_label
from pitstop.history.paths import default_path, resolve_path
from pitstop.history.store import APPLICATION_ID, HistoryStore, RunList, RunRecord, open_store

__all__ = [
    "APPLICATION_ID",
    "Comparison",
    "HistoryError",
    "HistoryStore",
    "MetricRow",
    "RunList",
    "RunRecord",
    "Verdict",
    "check",
    "compare_runs",
    "default_path",
    "find_baseline",
    "fingerprint",
    "fingerprint_diff",
    "fingerprint_fields",
    "git_head",
    "metric_rows",
    "open_store",
    "parse_max_drop",
    "record",
    "resolve_label",
    "resolve_path",
    "slowdown",
]


def record(result: dict[str, Any], kind: str, path: Path | None = None, label: str | None = None) -> int:
    """Store one result (a run or tune document) and return its run id.

    ``path``: the history file (default: ``default_path()``). ``label``: ``--label`` > ``$PITSTOP_LABEL`` >
    the current git branch. Raises ``HistoryError`` (a ``ValueError``) when the file cannot be used.
    """
    summarize(result)  # a document that cannot be stored is refused before the file is created
    with open_store(path) as store:
        return store.add(result, kind, label=label)
