"""Where a result goes besides the terminal: ``--json``, ``--html``, ``--tensorboard`` and the history.

The caller builds the document once and hands it over; the files are written before the terminal report,
so a closed terminal never loses the result. ``-`` is standard output (the terminal report then goes to
standard error, so a pipe receives the document alone); a device or FIFO is written in place, a link where
it points (see ``pitstop.atomic``); a folder is refused before anything runs."""

from __future__ import annotations

import json
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from pitstop.atomic import target_kind, write_atomic
from pitstop.cli.errors import UserError
from pitstop.report.untrusted import shown

STDOUT = "-"


def is_stdout(path: Path | None) -> bool:
    return path is not None and str(path) == STDOUT


def check_target(path: Path, option: str) -> None:
    """Refuse, in one line and exit 2, an output that can never be written: a folder, a missing folder."""
    if is_stdout(path):
        return
    if target_kind(path) == "folder":
        raise UserError(f"{option} {shown(str(path))}: is a folder; give a file name", 2)
    parent = path.resolve().parent if path.is_symlink() else path.parent
    if not parent.exists():
        raise UserError(f"cannot write {shown(str(path))}: folder {shown(str(parent))} does not exist", 2)


def write_output(path: Path, text: str) -> None:
    """Write a requested output: ``-`` to standard output, else atomically (devices and FIFOs in place);
    a failure is one line and exit 1 (the run itself succeeded)."""
    if is_stdout(path):
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        return
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise UserError(f"cannot write {shown(str(path))}: {exc.strerror or exc}", 1) from None


def _damaged(exc: BaseException) -> str:
    return f"the document is damaged: {type(exc).__name__}: {exc} (no run pitstop measured holds this)"


@dataclass
class Outputs:
    json: Path | None = None
    html: Path | None = None
    tensorboard: Path | None = None
    history: Path | None = None
    record: bool = False

    def check(self) -> None:
        """Refuse, before any measuring, targets that cannot be written."""
        if is_stdout(self.json) and is_stdout(self.html):
            raise UserError("--json - and --html - cannot both be standard output", 2)
        for option, path in (("--json", self.json), ("--html", self.html)):
            if path is not None:
                check_target(path, option)
        if self.tensorboard is not None and target_kind(self.tensorboard) not in ("missing", "folder"):
            raise UserError(f"--tensorboard {shown(str(self.tensorboard))}: not a folder", 2)
        if self.record:
            self._check_history()

    def _check_history(self) -> None:
        """A history that is a FIFO, a device or a folder can never record: refused before the run (a FIFO
        would block the open forever). A history that cannot be found is left to ``remember`` (a warning)."""
        from pitstop.history import HistoryError, resolve_path
        from pitstop.regular import regular_problem

        try:
            where = resolve_path(self.history)
        except HistoryError:
            return
        problem = regular_problem(where, empty_ok=True)
        if problem is not None:
            raise UserError(
                f"history {problem}; record elsewhere with --history PATH, or pass --no-history", 2
            )

    def takes_stdout(self) -> bool:
        return is_stdout(self.json) or is_stdout(self.html)

    def terminal(self) -> Console:
        """Where the human report goes: standard output, unless the document itself goes there."""
        return Console(stderr=self.takes_stdout())

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
            except (OverflowError, RecursionError) as exc:  # a number or a nesting no real run has
                raise UserError(_damaged(exc)) from None
            write_output(self.html, html)
            if not is_stdout(self.html):
                where = escape(shown(str(self.html)))
                console.print(
                    f"[dim]report written to {where} ({len(html) / 1024:,.0f} KiB)[/dim]", soft_wrap=True
                )
        if self.tensorboard is not None:
            from pitstop.report.tensorboard import write_tensorboard

            try:
                count = write_tensorboard(doc, self.tensorboard)
            except (OverflowError, RecursionError) as exc:
                raise UserError(_damaged(exc)) from None
            where = escape(shown(str(self.tensorboard)))
            console.print(
                f"[dim]{count:,} scalars written for TensorBoard under {where}[/dim]", soft_wrap=True
            )

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
            message = escape(shown(str(exc)))
            console.print(f"[yellow]pitstop: not recorded in the history: {message}[/yellow]", soft_wrap=True)
            return None
        place = escape(shown(str(where)))
        console.print(
            f"[dim]recorded as run {run_id} in {place} (pitstop history show {run_id})[/dim]", soft_wrap=True
        )
        return run_id
