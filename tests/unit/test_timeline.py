"""Step accounting: marks to spans, device timings read a step late, counts summed lazily."""

from __future__ import annotations

from typing import Any

import pytest

from pitstop.core.profile import CountSource
from pitstop.probe.timeline import (
    BWD_END,
    BWD_START,
    DATA,
    FWD_START,
    OPT_END,
    OPT_START,
    START,
    BatchCounts,
    StepBuilder,
    chosen_counts,
    phase_spans,
)


def test_phase_spans_with_gradient_accumulation() -> None:
    kinds = [START, DATA, BWD_START, BWD_END, DATA, BWD_START, BWD_END, OPT_START, OPT_END]
    times = [0.0, 0.1, 0.3, 0.7, 0.8, 1.0, 1.4, 1.5, 1.6]
    fwd, bwd, opt = phase_spans(kinds, times)
    assert fwd == pytest.approx(0.2 + 0.2)
    assert bwd == pytest.approx(0.4 + 0.4)
    assert opt == pytest.approx(0.1)


def test_forward_without_a_dataloader_starts_at_the_step() -> None:
    fwd, bwd, opt = phase_spans([START, BWD_START, BWD_END, OPT_START, OPT_END], [0.0, 0.25, 0.5, 0.5, 0.6])
    assert (fwd, bwd, opt) == pytest.approx((0.25, 0.25, 0.1))
    # the probe saw the outermost forward start: the loop's own batch building before it is not forward
    fwd, _, _ = phase_spans([START, FWD_START, BWD_START, BWD_END], [0.0, 0.15, 0.25, 0.5])
    assert fwd == pytest.approx(0.1)


def test_counts_come_from_the_dataloader_when_it_has_tokens_else_from_the_model_inputs() -> None:
    loader, model = BatchCounts(samples=4, tokens=None), BatchCounts(samples=4, tokens=64)
    assert chosen_counts([loader], [model]) == (CountSource.MODEL_INPUTS, [model])
    counted = BatchCounts(samples=4, tokens=60)
    assert chosen_counts([counted], [model]) == (CountSource.DATALOADER, [counted])
    assert chosen_counts([loader], []) == (CountSource.DATALOADER, [loader])
    assert chosen_counts([], []) == (CountSource.UNKNOWN, [])


class LateClock:
    """A device clock whose marks become readable only when told (like CUDA events)."""

    def __init__(self) -> None:
        self.t = 0.0
        self.done_until = -1.0
        self.waited = 0

    def mark(self) -> float:
        self.t += 0.1
        return self.t

    def ready(self, handle: Any) -> bool:
        return handle <= self.done_until

    def wait(self, handle: Any) -> None:
        self.waited += 1
        self.done_until = max(self.done_until, handle)

    def seconds_between(self, a: Any, b: Any) -> float:
        return b - a


def _one_step(builder: StepBuilder) -> Any:
    builder.mark(DATA)
    builder.mark(BWD_START)
    builder.mark(BWD_END)
    builder.mark(OPT_START)
    return builder.end_step()


def test_device_spans_arrive_a_step_late_and_drain_waits_once() -> None:
    clock = LateClock()
    host = iter(float(i) for i in range(100))
    builder = StepBuilder(clock, now=lambda: next(host))
    first = _one_step(builder)
    assert first.forward_s is None  # the device has not reached the step yet: nothing read, no wait
    clock.done_until = clock.t  # the device catches up during the next step
    second = _one_step(builder)
    assert first.forward_s == pytest.approx(0.1) and first.backward_s == pytest.approx(0.1)
    assert second.forward_s is None
    builder.drain()
    assert second.optimizer_s == pytest.approx(0.1)
    assert clock.waited == 1


def test_wall_time_and_counts() -> None:
    host = iter([0.0, 1.0, 1.5])
    builder = StepBuilder(LateClock(), now=lambda: next(host))
    builder.data_wait(0.25)
    builder.batch(
        BatchCounts(samples=2, tokens=20, real_tokens=15, loss_tokens=10, examples=3, seq_len=10, nbytes=8)
    )
    builder.batch(BatchCounts(samples=2, tokens=24, real_tokens=None, seq_len=12))
    builder.sync(0.01)
    rec = _one_step(builder)
    assert rec.wall_s == pytest.approx(1.0)
    assert rec.data_wait_s == pytest.approx(0.25)
    assert (rec.samples, rec.tokens, rec.seq_len, rec.syncs) == (4, 44, 12, 1)
    assert rec.real_tokens is None  # one micro-batch could not say: the step cannot either
    assert rec.micro_batches == 1


def test_device_counts_resolve_at_drain() -> None:
    torch = pytest.importorskip("torch")
    builder = StepBuilder(LateClock())
    builder.batch(BatchCounts(samples=2, tokens=torch.tensor(7), real_tokens=torch.tensor(5)))
    rec = _one_step(builder)
    assert not isinstance(rec.tokens, int)
    builder.drain()
    assert rec.tokens == 7 and rec.real_tokens == 5


def test_packed_rows_from_device_lengths_resolve_at_drain() -> None:
    """Per-row lengths a GPU batch leaves on the device are packed at the window's end, summed over the
    step's micro-batches with those already counted on the host."""
    from pitstop.probe.batch import RowLengths

    torch = pytest.importorskip("torch")
    builder = StepBuilder(LateClock())
    lengths = RowLengths(torch.tensor([100, 100, 100, 60, 20]), 256)  # first fit: 2 rows of 256
    builder.batch(BatchCounts(samples=5, tokens=1280, packed_rows=lengths))
    builder.batch(BatchCounts(samples=5, tokens=1280, packed_rows=3))
    rec = _one_step(builder)
    assert rec.packed_rows is None  # not before the device is read
    builder.drain()
    assert rec.packed_rows == 5
