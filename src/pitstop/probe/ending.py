"""Ending the observed job once its measurement window is written (zero-code runner only)."""

from __future__ import annotations

import os
import sys


def end_the_job(announce: bool, steps: int) -> None:
    """The rank file is complete: stop the job. Does not return."""
    if announce:
        print(f"pitstop: measured {steps} steps; stopping the run", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
