"""Strings pitstop did not write itself (command arguments, labels, paths, anything read from a file, a trace
or a job), made safe for the terminal.

Two dangers, both closed here: rich markup (``[/a]`` ends in ``MarkupError``, ``[red]`` restyles the line)
and terminal control sequences (``ESC ]8;;`` hyperlinks, ``ESC [2J`` clearing the screen, a bare ``\\r``
overwriting the line). ``shown`` replaces every control character (C0 but newline and tab, DEL, C1, and the
bidirectional overrides that reorder what is shown) with a visible ``\\xNN`` / ``\\uNNNN`` escape, so the
evidence stays readable and nothing is interpreted; ``as_text`` wraps the result in a rich ``Text`` (never
parsed as markup); ``markup`` escapes it for a place where markup is parsed.
"""

from __future__ import annotations

from rich.markup import escape
from rich.text import Text

_BIDI = (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)
_CONTROLS = [c for c in (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)) if c not in (0x09, 0x0A)]
_TABLE: dict[int, str] = {c: f"\\x{c:02x}" for c in _CONTROLS} | {c: f"\\u{c:04x}" for c in _BIDI}
_ONE_LINE = _TABLE | {0x0A: "\\n", 0x09: "\\t"}


def shown(text: object, *, one_line: bool = False) -> str:
    """``text`` with every control character written out as an escape; ``one_line`` escapes newline and tab
    too (for a message that must stay one line)."""
    return str(text).translate(_ONE_LINE if one_line else _TABLE)


def as_text(text: object, style: str = "", *, one_line: bool = False) -> Text:
    """A rich ``Text`` of an untrusted string: shown as written, never read as markup."""
    return Text(shown(text, one_line=one_line), style=style)


def markup(text: object, *, one_line: bool = False) -> str:
    """An untrusted string to put inside a markup string (``f"[dim]{markup(path)}[/dim]"``)."""
    return escape(shown(text, one_line=one_line))
