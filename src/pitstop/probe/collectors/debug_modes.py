"""Debug and safety modes left on: autograd's anomaly detection (per measured step, and the job's line that
switched it on) and the settings read once at the first step (``CUDA_LAUNCH_BLOCKING``,
``TORCH_DISTRIBUTED_DEBUG``, deterministic algorithms).

Anomaly detection is switched on by ``torch.autograd.set_detect_anomaly(True)``, the ``detect_anomaly()``
context (around a step, or Lightning's ``detect_anomaly=True`` around the whole fit), all through
``torch.set_anomaly_enabled``: wrapped from the probe's installation on, it hands every call on unchanged, then
notes the state the call left (a tune trial's ``debug_off`` keeps a request to switch on from taking effect)
and where an enabling call came from. A step counts when the mode was on at its end or was switched on in it
(a context that closed before the step's end)."""

from __future__ import annotations

import os
import sys
from typing import Any

from pitstop.core.profile import DebugModes, RankProfile
from pitstop.frames import job_line
from pitstop.probe.collectors.base import Collector, ProbeContext, collector

ENV_SETTINGS = {  # variable -> the values that slow every step
    "CUDA_LAUNCH_BLOCKING": ("1", "true", "yes"),
    "TORCH_DISTRIBUTED_DEBUG": ("DETAIL", "INFO"),
}
TORCH_PROFILER = "torch.profiler (or emit_nvtx / the autograd profiler)"
PYTHON_PROFILER = "a Python profiler (cProfile, sys.setprofile: Lightning's 'advanced' profiler)"
PYTHON_TRACER = "a Python tracer (sys.settrace: a debugger or coverage)"


def profilers_on() -> list[str]:
    """The profilers and tracers running in this thread now: each hooks every operation or every Python call."""
    import torch

    found = [TORCH_PROFILER] if getattr(torch.autograd.profiler, "_is_profiler_enabled", False) else []
    if sys.getprofile() is not None:
        found.append(PYTHON_PROFILER)
    if sys.gettrace() is not None:
        found.append(PYTHON_TRACER)
    return found


def settings_on(environ: dict[str, str] | os._Environ[str], deterministic: bool) -> list[str]:
    """The slow settings among the environment's and torch's, as a user would write them."""
    found = [
        f"{name}={environ[name]}"
        for name, slow in ENV_SETTINGS.items()
        if environ.get(name, "").strip().upper() in {v.upper() for v in slow}
    ]
    if deterministic:
        found.append("torch.use_deterministic_algorithms(True)")
    return found


@collector
class DebugModesCollector(Collector):
    """The counters are ``DebugModes`` (the profile's own dataclass); None until the window starts. No work
    per step: the wrapped ``set_anomaly_enabled`` notes the steps it was switched on in, and a mode on at the
    window's start counts for every step until the job switches it off."""

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.stats: DebugModes | None = None
        self.site: str | None = None  # where the job last switched anomaly detection on
        self._settings: list[str] = []
        self._counting = False
        self._on_at_start = False  # anomaly detection on when the window started
        self._off_at: int | None = None  # the step it was first switched off in, after that
        self._enabled_in: set[int] = set()  # steps of the window it was switched on in

    def install(self) -> None:
        import torch

        is_on = torch.is_anomaly_enabled

        def make(original: Any) -> Any:
            def set_anomaly_enabled(enabled: bool, *args: Any, **kwargs: Any) -> Any:
                result = original(enabled, *args, **kwargs)
                if self.ctx.hooks.active:  # the state the call left: a tune trial may have kept it off
                    self._note(bool(is_on()))
                return result

            return set_anomaly_enabled

        self.ctx.hooks.patch(torch, "set_anomaly_enabled", make)

    def _note(self, enabled: bool) -> None:
        if enabled:
            self.site = job_line(sys._getframe(2)) or self.site
        if not self._counting:
            return
        step = self.ctx.step_index()
        if enabled:
            self._enabled_in.add(step)
        elif self._off_at is None:
            self._off_at = step

    def begin(self) -> None:
        import torch

        self._settings = settings_on(os.environ, torch.are_deterministic_algorithms_enabled())

    def start_window(self) -> None:
        import torch

        self.stats = DebugModes(settings=list(self._settings), profilers=profilers_on())
        self._on_at_start = torch.is_anomaly_enabled()
        self._off_at = None
        self._enabled_in = set()
        self._counting = True

    def stop_window(self) -> None:
        self._counting = False

    def fill(self, draft: RankProfile) -> None:
        stats = self.stats
        if stats is not None:
            stats.anomaly_steps = sum(
                1
                for s in draft.steps
                if s.index in self._enabled_in
                or (self._on_at_start and (self._off_at is None or s.index <= self._off_at))
            )
            stats.anomaly_site = self.site if stats.anomaly_steps else None
        draft.debug_modes = stats
