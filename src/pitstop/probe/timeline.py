"""Turning hook calls into StepRecords.

The probe sees a stream of events: a batch arrived after waiting w seconds, backward started / ended,
the optimizer started / ended. Those events are *marks* on a clock. On a CPU the clock is the host's
``perf_counter``; on a GPU it is a CUDA event recorded on the current stream, read a step late so the
host never waits for the device. The same code turns marks into forward / backward / optimizer spans
either way, which is what lets the GPU logic be tested on a CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pitstop.core.profile import CountSource, StepRecord

_COUNT_FIELDS = ("samples", "tokens", "real_tokens", "loss_tokens", "examples", "attended")
START, DATA, BWD_START, BWD_END, OPT_START, OPT_END, FWD_BOUNDARY = (
    "start",
    "data",
    "bwd_start",
    "bwd_end",
    "opt_start",
    "opt_end",
    "fwd_boundary",  # a step closed at the next forward (no optimizer step delimits the job's steps)
)
FWD_START = "fwd_start"  # the outermost forward began (a loop without a DataLoader: its batch is ready)
# a rollout generation call (an online RL trainer's generate() / vLLM) began / ended: the GENERATE phase
GEN_START, GEN_END = "gen_start", "gen_end"


class Clock(Protocol):
    def mark(self) -> Any:
        """A handle for 'now' on the timeline that executes the work."""

    def ready(self, handle: Any) -> bool:
        """Whether the handle's time can be read without blocking."""

    def wait(self, handle: Any) -> None:
        """Block until the handle's time can be read (only at the end of a window)."""

    def seconds_between(self, a: Any, b: Any) -> float: ...


class HostClock:
    """Host wall clock; everything is ready at once."""

    def mark(self) -> float:
        return time.perf_counter()

    def ready(self, handle: Any) -> bool:
        return True

    def wait(self, handle: Any) -> None:
        return None

    def seconds_between(self, a: Any, b: Any) -> float:
        return float(b - a)


def phase_spans(kinds: list[str], seconds: list[float]) -> tuple[float, float, float]:
    """Forward, backward and optimizer time from ordered marks (seconds relative to any origin).

    Forward is everything from the latest of {step start, batch ready, outermost forward start, previous
    backward end} up to a backward start; with gradient accumulation the micro-batches add up. A generation
    call inside that span (a trainer that generates after its batch arrived) is not forward: it is the
    step's GENERATE phase (``generation_span``).
    """
    forward = backward = optimizer = 0.0
    anchor: float | None = None
    bwd_start: float | None = None
    opt_start: float | None = None
    gen_start: float | None = None
    for kind, t in zip(kinds, seconds, strict=True):
        if kind == GEN_START:
            gen_start = t
        elif kind == GEN_END:
            if gen_start is not None and anchor is not None and bwd_start is None:
                anchor += max(0.0, t - max(anchor, gen_start))  # the part inside the forward span
            gen_start = None
        elif kind in (START, DATA, FWD_START):
            if bwd_start is None:
                anchor = t
        elif kind == BWD_START:
            if bwd_start is None:
                if anchor is not None:
                    forward += max(0.0, t - anchor)
                bwd_start = t
        elif kind == BWD_END:
            if bwd_start is not None:
                backward += max(0.0, t - bwd_start)
                bwd_start = None
                anchor = t
        elif kind == OPT_START:
            opt_start = t
        elif kind == OPT_END and opt_start is not None:
            optimizer += max(0.0, t - opt_start)
            opt_start = None
            anchor = t
    return forward, backward, optimizer


def generation_span(kinds: list[str], seconds: list[float]) -> float:
    """Seconds between each generation call's start and end mark (the step's GENERATE phase)."""
    total = 0.0
    start: float | None = None
    for kind, t in zip(kinds, seconds, strict=True):
        if kind == GEN_START:
            start = t
        elif kind == GEN_END and start is not None:
            total += max(0.0, t - start)
            start = None
    return total


@dataclass
class BatchCounts:
    """What one micro-batch carried. Values are ints, or 0-dim device tensors resolved at the end."""

    samples: Any = None
    tokens: Any = None
    real_tokens: Any = None
    loss_tokens: Any = None
    examples: Any = None
    attended: Any = None  # Σ L² over the examples (the attention FLOPs weight)
    packed_rows: Any = (
        None  # rows first-fit packing needs at the same width: an int, or RowLengths to resolve
    )
    seq_len: int | None = None
    nbytes: int = 0


@dataclass
class _OpenStep:
    marks: list[tuple[str, Any]] = field(default_factory=list)
    data_wait_s: float = 0.0
    micro_batches: int = 0
    batches: list[BatchCounts] = field(default_factory=list)
    model_batches: list[BatchCounts] = field(default_factory=list)  # counted from the model's inputs
    syncs: int = 0
    sync_s: float = 0.0


def chosen_counts(
    batches: list[BatchCounts], model_batches: list[BatchCounts]
) -> tuple[CountSource, list[BatchCounts]]:
    """Which of a step's counts stand for it: the DataLoader's batches when they carry tokens, else the
    model's inputs when those do, else whichever counts rows."""
    for source, found in ((CountSource.DATALOADER, batches), (CountSource.MODEL_INPUTS, model_batches)):
        if any(b.tokens is not None for b in found):
            return source, found
    for source, found in ((CountSource.DATALOADER, batches), (CountSource.MODEL_INPUTS, model_batches)):
        if any(b.samples is not None for b in found):
            return source, found
    return CountSource.UNKNOWN, []


def _add(values: list[Any]) -> Any:
    """Sum ints and device tensors without forcing a device sync (None if any value is unknown)."""
    if not values or any(v is None for v in values):
        return None
    total: Any = 0
    for v in values:
        total = total + v
    return total


class StepBuilder:
    """Accumulates one optimizer step at a time and hands back finished StepRecords.

    Device-timeline spans are filled in when the clock says their marks are ready, so on a GPU a step's
    forward/backward/optimizer figures arrive one step later than its wall time.
    """

    def __init__(self, clock: Clock, now: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.now = now
        self.index = 0
        self._first_start = now()  # the first step is timed from when the probe was installed
        self._last_end_host: float | None = None
        self._last_end_mark: Any = None
        self._open = _OpenStep()
        self._unresolved: list[tuple[StepRecord, list[tuple[str, Any]]]] = []
        self._lazy: list[StepRecord] = []
        self._lazy_rows: list[tuple[StepRecord, list[Any]]] = []  # packed rows from device lengths
        self.resolved: list[StepRecord] = []  # steps whose device spans are known, not yet taken (streamed)
        self.count_sources: dict[int, CountSource] = {}  # step index -> where its counts came from
        self.generation_watched = (
            False  # steps carry generate_s (0.0 without a call) once generation is watched
        )

    def switch_clock(self, clock: Clock) -> None:
        """Use another clock from the next step on (the probe learns at step 1 that the run is on a GPU)."""
        self.clock = clock
        self._last_end_mark = None  # a mark of the old clock cannot start a span on the new one

    # -- events -----------------------------------------------------------------------------------
    def mark(self, kind: str) -> None:
        self._open.marks.append((kind, self.clock.mark()))
        if kind == BWD_START:
            self._open.micro_batches += 1

    def data_wait(self, seconds: float) -> None:
        self._open.data_wait_s += seconds

    def batch(self, counts: BatchCounts) -> None:
        self._open.batches.append(counts)

    def model_batch(self, counts: BatchCounts) -> None:
        """Counts of one forward's inputs: they stand for the step only where its DataLoader's do not."""
        self._open.model_batches.append(counts)

    def sync(self, seconds: float | None) -> None:
        """One host sync; ``seconds`` None when it was detected but could not be timed."""
        self._open.syncs += 1
        self._open.sync_s += seconds or 0.0

    def end_step(self, kind: str = OPT_END) -> StepRecord:
        """Close the step at an optimizer-step end (or ``FWD_BOUNDARY``: the next step's forward) and return
        its record (device spans may follow)."""
        self.mark(kind)
        now = self.now()
        step, self._open = self._open, _OpenStep()
        self.index += 1
        start_host = self._last_end_host
        start_mark = self._last_end_mark
        self._last_end_host = now
        self._last_end_mark = step.marks[-1][1]
        if start_host is None:
            start_host = self._first_start
        record = StepRecord(
            index=self.index,
            wall_s=now - start_host,
            data_wait_s=step.data_wait_s,
            micro_batches=step.micro_batches,
            syncs=step.syncs,
            sync_s=step.sync_s,
            generate_s=0.0 if self.generation_watched else None,
        )
        source, batches = chosen_counts(step.batches, step.model_batches)
        self.count_sources[record.index] = source
        self._fill_counts(record, batches)
        if source is CountSource.MODEL_INPUTS:
            record.h2d_bytes = None  # the job copied its own batches: not seen
        marks = ([(START, start_mark)] if start_mark is not None else []) + step.marks
        self._unresolved.append((record, marks))
        self.poll()
        return record

    # -- resolution -------------------------------------------------------------------------------
    def poll(self) -> None:
        """Fill device spans of every step whose last mark the device has reached."""
        still: list[tuple[StepRecord, list[tuple[str, Any]]]] = []
        for record, marks in self._unresolved:
            if marks and not self.clock.ready(marks[-1][1]):
                still.append((record, marks))
                continue
            self._resolve(record, marks)
            self.resolved.append(record)
        self._unresolved = still

    def take_resolved(self) -> list[StepRecord]:
        """The steps resolved since the last call, in order."""
        taken, self.resolved = self.resolved, []
        return taken

    def drain(self) -> None:
        """Resolve everything, waiting for the device if needed (end of the window only)."""
        for _, marks in self._unresolved:
            if marks:
                self.clock.wait(marks[-1][1])
        self.poll()
        self._resolve_lazy_counts()

    def _resolve(self, record: StepRecord, marks: list[tuple[str, Any]]) -> None:
        if not marks:
            return
        origin = marks[0][1]
        kinds = [k for k, _ in marks]
        seconds = [self.clock.seconds_between(origin, h) for _, h in marks]
        record.forward_s, record.backward_s, record.optimizer_s = phase_spans(kinds, seconds)
        if GEN_START in kinds:
            record.generate_s = generation_span(kinds, seconds)

    def _fill_counts(self, record: StepRecord, batches: list[BatchCounts]) -> None:
        record.samples = _add([b.samples for b in batches])
        record.tokens = _add([b.tokens for b in batches])
        record.real_tokens = _add([b.real_tokens for b in batches])
        record.loss_tokens = _add([b.loss_tokens for b in batches])
        record.h2d_bytes = sum(b.nbytes for b in batches) if batches else None
        lens = [b.seq_len for b in batches if b.seq_len is not None]
        record.seq_len = max(lens) if lens else None
        record.examples = _add([b.examples for b in batches])
        record.attended = _add([b.attended for b in batches])
        packed = [b.packed_rows for b in batches]
        if packed and None not in packed:
            if all(isinstance(v, int) for v in packed):
                record.packed_rows = sum(packed)
            else:  # device lengths wait for the end, as the other counts do
                self._lazy_rows.append((record, packed))
        if any(not isinstance(getattr(record, n), int | None) for n in _COUNT_FIELDS):
            self._lazy.append(record)

    def _resolve_lazy_counts(self) -> None:
        for record in self._lazy:
            for name in _COUNT_FIELDS:
                value = getattr(record, name)
                if value is not None and not isinstance(value, int):
                    setattr(record, name, int(value.item()))
        self._lazy.clear()
        for record, packed in self._lazy_rows:
            record.packed_rows = sum(v if isinstance(v, int) else v.resolve() for v in packed)
        self._lazy_rows.clear()
