"""NVML's clock-event (throttle) reasons and the SM application clock, read beside each NVML sample.

pynvml renamed ``nvmlDeviceGetCurrentClocksThrottleReasons`` to ``...ClocksEventReasons`` (driver 535); either
is used. The application clock is the SM clock the GPU is set to run at; a busy GPU below it with a power or
thermal reason set is throttled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def clock_events(read: Callable[..., Any], sm_clock_id: int) -> tuple[int | None, float | None]:
    """(reasons bitmask, application SM clock in MHz) through ``read(function_name, *args)``, which answers
    None for a function the library or the GPU lacks."""
    reasons = read("nvmlDeviceGetCurrentClocksEventReasons")
    if reasons is None:
        reasons = read("nvmlDeviceGetCurrentClocksThrottleReasons")
    app = read("nvmlDeviceGetApplicationsClock", sm_clock_id)
    return (None if reasons is None else int(reasons)), (None if app is None else float(app))
