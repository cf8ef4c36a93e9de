"""The rank file's codec: the kinds of line a probed process writes, how a line is written, and how lines are
read back into a rank's profile, one at a time.

A rank file is one JSON object a line, ``{"kind": ..., ...}``, appended as things happen (``probe/stream.py``
writes and reads the file). Both readers decode it here: the runner at the job's end (``read_text``: the whole
file, the finished profile when the process wrote one, else the profile rebuilt from its lines) and
``runner/follow.py`` while the job runs (``decode`` one line at a time into a ``RankDraft``, handing each new
step on as it comes).

Lines, by kind (each written as ``line(kind, **payload)``):

==============  ==============================================================================================
``start``       ``rank``, ``local_rank``, ``pid``, ``warmup``: at the first optimizer step
``environment`` ``environment`` (an Environment), ``rank``, ``local_rank`` (read again at the first step)
``window``      ``t``: the measured window opened
``step``        ``step`` (a StepRecord, counts still on the device as unknown: ``plain_step``), ``t``
``gpu``         ``samples``: new GpuSamples
``host``        ``samples``: new HostSamples
``error``       ``text``: the probe disabled itself
``failure``     ``failure`` (a JobFailure): the uncaught exception that ended the process, as it was raised
``profile``     ``profile``: the finished RankProfile (it wins over every line before it)
==============  ==============================================================================================

A reader skips a line it cannot read (one cut short by a death, or damaged) and a kind it does not know (a
newer pitstop wrote it), so an old file reads in a new pitstop and a new one in an old.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pitstop.core.profile import (
    Environment,
    GpuSample,
    HostSample,
    JobFailure,
    RankProfile,
    StepRecord,
    assemble_rank,
    from_jsonable,
    to_jsonable,
)
from pitstop.core.vocabulary import StrEnum


class Kind(StrEnum):
    START = "start"
    ENVIRONMENT = "environment"
    WINDOW = "window"
    STEP = "step"
    GPU = "gpu"
    HOST = "host"
    ERROR = "error"
    FAILURE = "failure"
    PROFILE = "profile"


# a step's counts that may still be device tensors at its end (read only at the end of a window)
DEVICE_COUNTS = ("samples", "tokens", "real_tokens", "loss_tokens", "examples")


def on_host(record: StepRecord) -> StepRecord:
    """The record with every count that is not yet a plain int (a device tensor) as unknown: reading it now
    would wait for the GPU."""
    changes: dict[str, Any] = {
        n: None for n in DEVICE_COUNTS if not isinstance(getattr(record, n), int | None)
    }
    return dataclasses.replace(record, **changes) if changes else record


def plain_step(record: StepRecord) -> dict[str, Any]:
    """A step as a ``step`` line's JSON; counts still on the device go as unknown."""
    return dict(to_jsonable(on_host(record)))


def line(kind: str, **payload: Any) -> str:
    """One line of the rank file, its newline included."""
    return json.dumps({"kind": kind, **payload}, separators=(",", ":")) + "\n"


# -- lines read back --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    rank: int
    local_rank: int
    pid: int | None
    warmup: int


@dataclass(frozen=True)
class EnvironmentSeen:
    environment: Environment | None
    rank: int | None  # None: the line did not say
    local_rank: int | None


@dataclass(frozen=True)
class WindowOpened:
    t: float


@dataclass(frozen=True)
class Step:
    record: StepRecord
    t: float


@dataclass(frozen=True)
class GpuReadings:
    samples: list[GpuSample]


@dataclass(frozen=True)
class HostReadings:
    samples: list[HostSample]


@dataclass(frozen=True)
class ProbeError:
    text: str


@dataclass(frozen=True)
class Failed:
    failure: JobFailure


@dataclass(frozen=True)
class Finished:
    profile: RankProfile


Record = (
    Start
    | EnvironmentSeen
    | WindowOpened
    | Step
    | GpuReadings
    | HostReadings
    | ProbeError
    | Failed
    | Finished
)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _environment(item: dict[str, Any]) -> EnvironmentSeen:
    env = from_jsonable(Environment, item["environment"]) if "environment" in item else None
    return EnvironmentSeen(env, _optional_int(item.get("rank")), _optional_int(item.get("local_rank")))


_DECODERS: dict[str, Callable[[dict[str, Any]], Record]] = {
    Kind.START: lambda d: Start(
        int(d.get("rank", 0)),
        int(d.get("local_rank", 0)),
        _optional_int(d.get("pid")),
        int(d.get("warmup", 0)),
    ),
    Kind.ENVIRONMENT: _environment,
    Kind.WINDOW: lambda d: WindowOpened(float(d["t"])),
    Kind.STEP: lambda d: Step(from_jsonable(StepRecord, d["step"]), float(d["t"])),
    Kind.GPU: lambda d: GpuReadings([from_jsonable(GpuSample, s) for s in d["samples"]]),
    Kind.HOST: lambda d: HostReadings([from_jsonable(HostSample, s) for s in d["samples"]]),
    Kind.ERROR: lambda d: ProbeError(str(d["text"])),
    Kind.FAILURE: lambda d: Failed(from_jsonable(JobFailure, d["failure"])),
    Kind.PROFILE: lambda d: Finished(from_jsonable(RankProfile, d["profile"])),
}


def decode(raw: str) -> Record | None:
    """One line read back; None for a line that is not whole or not readable, or of a kind not known here."""
    try:
        item = json.loads(raw)
        if not isinstance(item, dict):
            return None
        kind = item.get("kind")
        decoder = _DECODERS.get(kind) if isinstance(kind, str) else None
        return decoder(item) if decoder is not None else None
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


@dataclass
class RankDraft:
    """A rank file read so far, line by line (``add``); ``profile()`` assembles the RankProfile it holds.

    ``keep=False`` keeps only who the rank is (its start and environment lines): the live follower hands
    each step and reading on as it comes, and a watch of a long run must not hold them all."""

    keep: bool = True
    start: Start | None = None
    environment_seen: EnvironmentSeen | None = None
    window_t: float | None = None
    last_t: float | None = None
    steps: list[StepRecord] = field(default_factory=list)  # every step, the warm-up's too
    gpu: list[GpuSample] = field(default_factory=list)
    host: list[HostSample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    failure: JobFailure | None = (
        None  # the uncaught exception that ended the process (it may follow the profile)
    )
    finished: RankProfile | None = None  # the profile the process wrote at its end

    def _said(self, name: str) -> int:
        """``rank`` / ``local_rank`` as the environment line says it (read again at the first step: some
        launchers set it late), else as the start line does, else 0."""
        seen = getattr(self.environment_seen, name, None)
        if seen is not None:
            return int(seen)
        return int(getattr(self.start, name, 0))

    @property
    def rank(self) -> int:
        return self._said("rank")

    @property
    def local_rank(self) -> int:
        return self._said("local_rank")

    @property
    def warmup(self) -> int:
        return self.start.warmup if self.start is not None else 0

    @property
    def environment(self) -> Environment | None:
        return self.environment_seen.environment if self.environment_seen is not None else None

    def add(self, record: Record) -> None:
        if isinstance(record, Start):
            self.start = record
        elif isinstance(record, EnvironmentSeen):
            self.environment_seen = record
        elif isinstance(record, WindowOpened):
            self.window_t = record.t
        elif isinstance(record, Step):
            self.last_t = record.t
            if self.keep:
                self.steps.append(record.record)
        elif isinstance(record, GpuReadings):
            if self.keep:
                self.gpu += record.samples
        elif isinstance(record, HostReadings):
            if self.keep:
                self.host += record.samples
        elif isinstance(record, ProbeError):
            self.errors.append(record.text)
        elif isinstance(record, Failed):
            self.failure = record.failure
        elif isinstance(record, Finished):
            self.finished = record.profile

    def profile(self) -> RankProfile:
        """The finished profile when the process wrote one, else the one its lines rebuild: the steps after
        the warm-up, the window from its opening to the last step's line. An exception line written after
        the finished profile (the job failed after its window) joins it."""
        if self.finished is not None:
            if self.finished.failure is None:
                self.finished.failure = self.failure
            return self.finished
        rebuilt = assemble_rank(
            self.rank,
            self.environment,
            steps=self.steps,
            warmup=self.warmup,
            local_rank=self.local_rank,
            pid=self.start.pid if self.start is not None else None,
            gpu_samples=self.gpu,
            host_samples=self.host,
            window=(self.window_t, self.last_t),
            errors=self.errors,
        )
        rebuilt.failure = self.failure
        return rebuilt


def read_text(text: str) -> tuple[RankProfile, bool] | None:
    """The RankProfile a rank file's text holds and whether the process finished it (False: it died first and
    this is rebuilt from its lines); None when it holds neither a start, an error nor a failure."""
    raw_lines = text.splitlines()
    last = next((raw for raw in reversed(raw_lines) if raw.strip()), None)
    record = decode(last) if last is not None else None
    if isinstance(record, Finished):  # finished: the step lines need no reading
        return record.profile, True
    draft = RankDraft()
    for raw in raw_lines:
        found = decode(raw)
        if found is not None:
            draft.add(found)
    if draft.finished is not None:
        return draft.profile(), True
    if draft.start is None and not draft.errors and draft.failure is None:
        return None
    return draft.profile(), False
