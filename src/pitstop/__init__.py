"""pitstop: find out why a fine-tuning run is slower than it should be, and prove each fix by measuring.

Importing pitstop is cheap: torch, transformers and NVML are only imported by the parts that need them.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "watch"]


def __getattr__(name: str) -> Any:
    if name == "watch":
        from pitstop.integrations.loop import watch

        return watch
    raise AttributeError(f"module 'pitstop' has no attribute {name!r}")
