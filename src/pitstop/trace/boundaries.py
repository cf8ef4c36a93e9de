"""Where the items of a JSON array can be cut apart, whatever the whitespace: one pass over the bytes with the
state a boundary needs (in a string or not, after a backslash in one, nesting depth).

``scan(text, start, depth, state, max_depth) -> (cut, stop, depth, state)``: ``cut`` is the offset of the last
comma at depth 0 outside strings in ``text[start:stop]`` (-1: none); the scan stops at the end, at the
bracket that closes the array (depth -1), or once the depth passes ``max_depth``; the state there carries
the scan on over the next bytes. The C version (``_eventloop.scan``) is used where it is built; the Python
one below gives the same result (tests compare them) and stays linear: a regular expression jumps to the
next structural byte, and over each string in one match.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

OUT_OF_STRING, IN_STRING, AFTER_BACKSLASH = 0, 1, 2
_STRUCTURAL = re.compile(rb'["{}\[\],]')
_STRING_BODY = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL)  # stops at the closing quote or a lone '\'

Scan = Callable[[bytes | bytearray | memoryview, int, int, int, int], tuple[int, int, int, int]]


def scan_python(
    text: bytes | bytearray | memoryview, start: int, depth: int, state: int, max_depth: int
) -> tuple[int, int, int, int]:
    """The reference scan (see the module's docstring)."""
    end, cut = len(text), -1
    p = min(max(start, 0), end)
    while p < end:
        if state == AFTER_BACKSLASH:
            state, p = IN_STRING, p + 1
            continue
        if state == IN_STRING:
            p = _STRING_BODY.match(text, p).end()  # type: ignore[union-attr]
            if p == end:
                break
            state, p = (OUT_OF_STRING, p + 1) if text[p] == 0x22 else (AFTER_BACKSLASH, p + 1)
            continue
        m = _STRUCTURAL.search(text, p)
        if m is None:
            p = end
            break
        p, c = m.start(), text[m.start()]
        if c == 0x22:  # "
            state = IN_STRING
        elif c == 0x2C:  # ,
            if depth == 0:
                cut = p
        elif c in (0x7B, 0x5B):  # { [
            depth += 1
            if depth > max_depth:
                return cut, p + 1, depth, state
        else:  # } ]
            depth -= 1
            if depth < 0:
                return cut, p, depth, state
        p += 1
    return cut, p, depth, state


def scanner() -> Scan:
    """The C scan where it is built (and ``PITSTOP_TRACE_LOOP`` does not ask for Python), else the Python one."""
    if os.environ.get("PITSTOP_TRACE_LOOP") != "python":
        try:
            from pitstop.trace._eventloop import scan
        except ImportError:
            pass
        else:
            return scan
    return scan_python
