"""``pitstop report``: any saved result to a self-contained HTML file (and TensorBoard scalars); also the
``--html`` / ``--tensorboard`` options of doctor, analyze and tune."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from pitstop.cli.errors import UserError


def check_target(path: Path | None) -> None:
    if path is not None and not path.parent.exists():
        raise UserError(f"cannot write {path}: folder {path.parent} does not exist")


def write_html(doc: Any, path: Path | None) -> None:
    if path is None:
        return
    from pitstop.report.html import ReportError, render_html

    try:
        html = render_html(doc)
    except ReportError as exc:
        raise UserError(str(exc)) from None
    try:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(html, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}", 1) from None
    Console(stderr=True).print(f"[dim]report written to {path} ({len(html) / 1024:,.0f} KiB)[/dim]")


def write_tensorboard(doc: Any, folder: Path | None) -> None:
    if folder is None:
        return
    from pitstop.report.tensorboard import write_tensorboard as export

    count = export(doc, folder)
    Console(stderr=True).print(f"[dim]{count:,} scalars written for TensorBoard under {folder}[/dim]")


def read_result(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder; give the JSON file a pitstop command wrote") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read it ({exc})") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UserError(f"{path}: not JSON ({exc})") from None


def run_report(path: Path, html: Path | None, tensorboard: Path | None) -> int:
    if html is None and tensorboard is None:
        raise UserError("nothing to do: give --html FILE and/or --tensorboard DIR")
    check_target(html)
    doc = read_result(path)
    write_html(doc, html)
    write_tensorboard(doc, tensorboard)
    return 0
