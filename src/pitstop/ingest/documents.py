"""JSON and YAML documents (configs, Trainer outputs, model configs) parsed within limits, and cleaned.

Limits: nesting depth (no config is more than a few levels deep; a deep one only costs recursion), and
numbers that are not finite (``NaN``, ``Infinity``, ``1e400``) or beyond any count a run has: they are
replaced by ``None`` and counted, so no reader can pass them on as a measurement, and the count is stated.
Real ``trainer_state.json`` files do carry ``NaN`` (a diverged loss), so such a number is dropped, not fatal.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from pitstop.artifacts import IngestError
from pitstop.ingest.yamlsafe import load_yaml

MAX_DEPTH = 64
MAX_INT = 2**62  # beyond any step, token or byte count; also keeps float() of it from overflowing


@dataclass
class Document:
    data: Any
    dropped: int = 0  # numbers replaced by None
    notes: list[str] = field(default_factory=list)


def _too_deep(name: str) -> IngestError:
    """One message for any depth past MAX_DEPTH, whether the decoder's recursion limit (which the job's
    libraries may have raised) or ``clean`` caught it."""
    return IngestError(f"{name}: nested more than {MAX_DEPTH} levels deep, which no config is")


def parse_json(text: str, name: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise _too_deep(name) from None
    except ValueError as exc:
        raise IngestError(f"{name}: invalid JSON ({exc.args[0] if exc.args else exc})") from None


def clean(data: Any, name: str) -> Document:
    """Refuse nesting deeper than MAX_DEPTH; replace non-finite and out-of-range numbers by None (in place)."""
    doc = Document(data=data)
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _too_deep(name)
        items: Any
        if isinstance(node, dict):
            items = node.items()
        elif isinstance(node, list):
            items = enumerate(node)
        else:
            continue
        for key, value in list(items):
            if _bad_number(value):
                node[key] = None
                doc.dropped += 1
            elif isinstance(value, dict | list):
                stack.append((value, depth + 1))
    if _bad_number(data):
        doc.data, doc.dropped = None, doc.dropped + 1
    if doc.dropped:
        doc.notes.append(
            f"{name}: {doc.dropped} value{'s' if doc.dropped > 1 else ''} not a finite number in range "
            "(NaN, Infinity, or too large) ignored"
        )
    return doc


def _bad_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, int):
        return abs(value) > MAX_INT
    return False


def load_document(text: str, name: str, as_json: bool) -> Document:
    """Parse ``text`` as JSON (or YAML) and clean it."""
    data = parse_json(text, name) if as_json else load_yaml(text, name)
    return clean(data, name)
