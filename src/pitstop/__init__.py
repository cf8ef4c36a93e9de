"""pitstop: find out why a fine-tuning run is slower than it should be, and prove each fix by measuring.

Importing pitstop is cheap: torch, transformers and NVML are only imported by the parts that need them.
"""

from __future__ import annotations

from typing import Any

from pitstop import display as _display
from pitstop.version import __version__  # written once, in pitstop/version.py (pyproject reads it there)

__all__ = ["__version__", "watch"]


def __getattr__(name: str) -> Any:
    if name == "watch":
        from pitstop.integrations.loop import watch

        return watch
    raise AttributeError(f"module 'pitstop' has no attribute {name!r}")


def _html_of(result: Any) -> str:
    """A result (Diagnosis, TuneResult, a saved document) as its HTML report, for notebooks' ``_repr_html_``:
    the lower layers that define results reach the report layer only through this front door, lazily."""
    from pitstop.report.notebook import notebook_html

    return notebook_html(result)


_display.plug(_html_of)
