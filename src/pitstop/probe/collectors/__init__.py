"""The probe's collectors: one measured signal each (see ``base``), in the order they fill a profile.

Adding a signal: one module here, named for it, holding its measuring code, its counters' dataclass and a
``Collector`` subclass marked ``@collector``; modules are discovered, not listed. The probe calls every
collector at the window's start and end and asks each to fill the profile; it needs no change unless the
signal listens at a hook the probe already routes (see ``docs/architecture.md``, "The probe").
"""

from __future__ import annotations

import importlib
import pkgutil

from pitstop.probe.collectors.base import REGISTERED, Collector, ProbeContext, overrides


def _discover() -> tuple[type[Collector], ...]:
    for module in pkgutil.iter_modules(__path__):
        if module.name != "base":
            importlib.import_module(f"{__name__}.{module.name}")
    return tuple(sorted(REGISTERED, key=lambda c: (c.order, c.__module__)))


COLLECTORS: tuple[type[Collector], ...] = _discover()

__all__ = ["COLLECTORS", "Collector", "ProbeContext", "overrides"]
