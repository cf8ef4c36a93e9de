"""How a result shows itself in a notebook (``_repr_html_``).

A Diagnosis and a TuneResult live in layers below the HTML report that shows them, so they cannot import it.
The package root, which runs before any of pitstop's modules, plugs the report's renderer in here; the
renderer imports the report only when a notebook asks, so ``import pitstop`` stays light."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_render: Callable[[Any], str] | None = None


def plug(render: Callable[[Any], str]) -> None:
    """Set what turns a result into its notebook HTML (the package root sets the HTML report's)."""
    global _render
    _render = render


def html_of(result: Any) -> str | None:
    """The result's notebook HTML; None, so the notebook shows its text, when no renderer is plugged in."""
    return None if _render is None else _render(result)
