"""Stored runs and comparisons as small HTML tables, for notebooks (``_repr_html_``). Plain tables with inline
styles: they sit in the notebook's own page, so nothing here may style anything outside them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

TABLE = 'style="border-collapse:collapse;font-size:13px;margin:4px 0"'
CELL = 'style="border:1px solid #ddd;padding:3px 8px;text-align:{align}"'


def _cell(value: Any, tag: str = "td", align: str = "left") -> str:
    text = "–" if value is None else str(value)
    return f"<{tag} {CELL.format(align=align)}>{escape(text)}</{tag}>"


def html_table(
    head: Sequence[str], rows: Iterable[Sequence[Any]], caption: str | None = None, right_from: int = 1
) -> str:
    """A table whose columns from ``right_from`` on are numbers (right-aligned)."""
    parts = [f"<table {TABLE}>"]
    if caption:
        parts.append(f'<caption style="text-align:left;font-weight:bold">{escape(caption)}</caption>')
    parts.append("<tr>" + "".join(_cell(h, "th") for h in head) + "</tr>")
    for row in rows:
        cells = [_cell(v, align="right" if i >= right_from else "left") for i, v in enumerate(row)]
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</table>")
    return "".join(parts)
