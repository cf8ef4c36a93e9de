"""Every doctor / analyze / tune result goes into the history, unless the user says not to. Storing it
must never cost the result itself: a history that cannot be written is a warning, not a failure."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from rich.console import Console


def remember(doc: dict[str, Any], kind: str, path: Path | None, enabled: bool = True) -> int | None:
    if not enabled:
        return None
    from pitstop.history import HistoryError, record, resolve_path

    console = Console(stderr=True)
    try:
        where = resolve_path(path)
        run_id = record(doc, kind, where)
    except (HistoryError, OSError, RuntimeError, sqlite3.Error) as exc:  # RuntimeError: no home folder
        console.print(f"[yellow]pitstop: not recorded in the history: {exc}[/yellow]", soft_wrap=True)
        return None
    console.print(
        f"[dim]recorded as run {run_id} in {where} (pitstop history show {run_id})[/dim]", soft_wrap=True
    )
    return run_id
