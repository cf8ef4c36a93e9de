"""Where a result goes besides the terminal: ``--json``, ``--html``, ``--tensorboard`` and the history.

The caller builds the document once and hands it over; the files are written before the terminal report,
so a closed terminal never loses the result."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from pitstop.atomic import write_atomic
from pitstop.cli.errors import UserError


def write_output(path: Path, text: str) -> None:
    """Write a requested output atomically; a failure is one line and exit 1."""
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}", 1) from None


@dataclass
class Outputs:
    json: Path | None = None
    html: Path | None = None
    tensorboard: Path | None = None
    history: Path | None = None
    record: bool = False

    def check(self) -> None:
        """Refuse, before any measuring, targets that cannot be written."""
        for path in (self.json, self.html):
            if path is not None and not path.parent.exists():
                raise UserError(f"cannot write {path}: folder {path.parent} does not exist")

    def write(self, doc: Any) -> None:
        console = Console(stderr=True)
        if self.json is not None:
            write_output(self.json, json.dumps(doc, indent=1, default=str))
        if self.html is not None:
            from pitstop.report.errors import ReportError
            from pitstop.report.html import render_html

            try:
                html = render_html(doc)
            except ReportError as exc:
                raise UserError(str(exc)) from None
            write_output(self.html, html)
            console.print(f"[dim]report written to {self.html} ({len(html) / 1024:,.0f} KiB)[/dim]")
        if self.tensorboard is not None:
            from pitstop.report.tensorboard import write_tensorboard

            count = write_tensorboard(doc, self.tensorboard)
            console.print(f"[dim]{count:,} scalars written for TensorBoard under {self.tensorboard}[/dim]")

    def remember(self, doc: dict[str, Any], kind: str) -> int | None:
        """Record the result in the history. Storing it must never cost the result: a history that cannot
        be written is a warning, not a failure."""
        if not self.record:
            return None
        from pitstop.history import HistoryError, record, resolve_path

        console = Console(stderr=True)
        try:
            where = resolve_path(self.history)
            run_id = record(doc, kind, where)
        except (HistoryError, OSError, RuntimeError, sqlite3.Error) as exc:  # RuntimeError: no home folder
            console.print(f"[yellow]pitstop: not recorded in the history: {exc}[/yellow]", soft_wrap=True)
            return None
        console.print(
            f"[dim]recorded as run {run_id} in {where} (pitstop history show {run_id})[/dim]", soft_wrap=True
        )
        return run_id
