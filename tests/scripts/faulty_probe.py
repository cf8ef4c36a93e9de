"""Runs plain_loop.py (or ``--script NAME`` from this folder) with a fault injected into the probe that
pitstop's runner installed in this process; ``--faulty-rank R`` injects it into rank R only (a torchrun job)."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from pitstop.probe.probe import Probe


def broken(self: Probe, *args: object) -> None:
    raise RuntimeError("injected fault")


def option(name: str, default: str | None) -> str | None:
    """Takes ``name VALUE`` out of the arguments (the rest go to the script)."""
    if name not in sys.argv:
        return default
    at = sys.argv.index(name)
    value = sys.argv[at + 1]
    del sys.argv[at : at + 2]
    return value


script = Path(__file__).with_name(option("--script", "plain_loop.py") or "plain_loop.py")
faulty = option("--faulty-rank", None)
if faulty is None or os.environ.get("RANK", "0") == faulty:
    Probe.on_batch = broken  # type: ignore[method-assign,assignment]
sys.argv = [str(script), *sys.argv[1:]]
runpy.run_path(str(script), run_name="__main__")
