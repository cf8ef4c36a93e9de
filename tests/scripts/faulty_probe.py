"""Runs plain_loop.py with a fault injected into the probe that pitstop's runner installed in this process."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from pitstop.probe.probe import Probe


def broken(self: Probe, *args: object) -> None:
    raise RuntimeError("injected fault")


Probe.on_batch = broken  # type: ignore[method-assign]
script = Path(__file__).with_name("plain_loop.py")
sys.argv = [str(script), *sys.argv[1:]]
runpy.run_path(str(script), run_name="__main__")
