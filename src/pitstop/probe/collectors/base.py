"""What a collector is: one measured signal, its counters in its own dataclass, told where the window is.

The probe (``probe.py``) keeps the step timeline and decides where the window starts and ends; every other
signal is a collector it orchestrates through the same few calls, in this order:

* ``install()`` / ``remove()`` — with the probe's hooks (only a collector that patches from the start);
* ``begin()`` — at the first optimizer step, once ``ProbeContext.environment`` and ``device`` are known;
* ``start_window()`` — the measured window starts: fresh counters;
* ``step_end(record)`` — after every step's record (warm-up included); only collectors that override it
  are called, so a collector without per-step work adds no per-step cost;
* ``stream(emit)`` — new readings for the rank file, after a step (only collectors that override it);
* ``stop_window()`` — the window ended or the probe was disabled: stop threads, stop counting (idempotent);
* ``closing()`` — the window ended and the probe ends the job next (doctor's and tune's windows only): the
  one moment a collector may spend the job's time and device on a measurement of its own;
* ``fill(draft)`` — write what was counted into the rank's RankProfile (called once per profile asked for;
  the draft already holds the steps, the environment and the errors).

A collector never raises into the job: the probe calls it inside its guard, and an error disables the probe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from pitstop.core.profile import Environment, RankProfile, StepRecord
from pitstop.core.vocabulary import Device
from pitstop.probe.config import ProbeConfig
from pitstop.probe.hooks import Hooks

Emit = Callable[..., None]  # emit(kind, **payload): one line of the rank file


@dataclass
class ProbeContext:
    """What the probe shares with its collectors. ``environment``, ``device`` and ``model`` are set at the
    first optimizer step, before ``begin``."""

    config: ProbeConfig
    origin: float  # perf_counter at the probe's start: samples' times are seconds since it
    hooks: Hooks
    errors: list[str]  # the probe's own notes (probe_errors), in the order they came
    disable: Callable[[BaseException], None]  # an internal error: the probe stops, the job goes on
    step_index: Callable[[], int]  # the step now under way (1-based)
    # the step timeline's GENERATE marks: a rollout generation call began (True) / ended; returns whether it
    # was marked (the training thread, not evaluation)
    mark_generation: Callable[[bool], bool] = lambda starting: False
    # steps carry generate_s from now on (0.0 without a call)
    watch_generation: Callable[[], None] = lambda: None
    environment: Environment | None = None
    device: Any = None  # torch.device the model computes on
    model: Any = None

    @property
    def on_cuda(self) -> bool:
        return self.environment is not None and self.environment.device == Device.CUDA


class Collector:
    """One measured signal. Every call has a do-nothing default: a collector overrides what it needs."""

    # where it stands among the collectors (lower first, then by module name): only one that reads what
    # others filled, or whose notes must come last, sets it
    order: ClassVar[int] = 0

    def __init__(self, ctx: ProbeContext) -> None:
        self.ctx = ctx

    def install(self) -> None:
        """Patch what the collector listens at, from the probe's installation on."""

    def remove(self) -> None:
        """Undo ``install`` (safe twice)."""

    def begin(self) -> None:
        """The first optimizer step: the environment and the device are known."""

    def start_window(self) -> None:
        """The measured window starts: counters start from zero."""

    def step_end(self, record: StepRecord) -> None:
        """A step closed (warm-up steps too)."""

    def stream(self, emit: Emit) -> None:
        """Append the readings taken since the last call to the rank file."""

    def stop_window(self) -> None:
        """Stop measuring (the window ended, or the probe was disabled); safe twice."""

    def closing(self) -> None:
        """The window ended and the job ends next: a measurement that costs the job time may run now."""

    def fill(self, draft: RankProfile) -> None:
        """Write the counters into the rank's profile."""


CountsT = TypeVar("CountsT")


class WindowCounts(Collector, Generic[CountsT]):
    """A collector whose counters are one dataclass (``counts_type``): fresh when the collector is made and
    again at every window start, so no subclass resets them by hand."""

    counts_type: type[CountsT]

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.counts: CountsT = self.counts_type()

    def start_window(self) -> None:
        self.counts = self.counts_type()


def overrides(collector: Collector, name: str) -> bool:
    """Whether ``collector`` does something at ``name`` (so the probe calls it only then)."""
    return getattr(type(collector), name) is not getattr(Collector, name)


CollectorT = TypeVar("CollectorT", bound=type[Collector])
REGISTERED: list[type[Collector]] = []  # filled as the collector modules are imported (``collectors``)


def collector(cls: CollectorT) -> CollectorT:
    """Class decorator: the probe runs this collector (``pitstop.probe.collectors`` finds the modules)."""
    REGISTERED.append(cls)
    return cls
