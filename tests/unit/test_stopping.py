"""The adaptive window: the warm-up ends when steps settle; measuring ends when the mean is precise."""

from __future__ import annotations

import random

from pitstop.probe.stopping import WindowRule, WindowTracker, t_quantile


def _run(times: list[float], rule: WindowRule) -> WindowTracker:
    tracker = WindowTracker(rule)
    for index, t in enumerate(times, start=1):
        if tracker.warmup_steps is None:
            tracker.warming(index, t)
            continue
        tracker.add(t)
        if tracker.done():
            break
    return tracker


def test_a_steady_job_stops_after_few_steps_with_the_stated_precision() -> None:
    rng = random.Random(0)
    times = [3.0, 1.5] + [1.0 + rng.gauss(0, 0.01) for _ in range(500)]
    tracker = _run(times, WindowRule(precision=0.03))
    assert tracker.warmup_steps is not None and tracker.warmup_steps >= 5  # the slow first steps are warm-up
    assert tracker.n == 8  # the minimum: 1% noise is precise at once
    assert (tracker.relative_halfwidth or 1.0) <= 0.03 and "known to" in tracker.reason()


def test_a_noisy_job_gets_a_longer_window() -> None:
    rng = random.Random(1)
    steady = _run([1.0 + rng.gauss(0, 0.01) for _ in range(500)], WindowRule())
    noisy = _run([1.0 + abs(rng.gauss(0, 0.4)) for _ in range(500)], WindowRule())
    assert noisy.n > 3 * steady.n and (noisy.relative_halfwidth or 1.0) <= 0.03


def test_limits_end_a_window_that_never_gets_precise() -> None:
    rng = random.Random(2)
    wild = [rng.choice([0.1, 5.0]) for _ in range(1000)]
    by_steps = _run(wild, WindowRule(max_steps=40, max_warmup=3))
    assert by_steps.n == 40 and "the most a window takes" in by_steps.reason()
    by_time = _run(wild, WindowRule(max_seconds=30.0, max_warmup=3))
    assert by_time.measured_s >= 30.0 and by_time.n < 40 and "time limit" in by_time.reason()


def test_t_quantile_is_close_to_the_table() -> None:
    for n, table in ((3, 4.303), (5, 2.776), (10, 2.262), (30, 2.045), (100, 1.984)):
        assert abs(t_quantile(n) - table) / table < 0.06


def test_a_machine_too_noisy_to_settle_still_gets_measured() -> None:
    rng = random.Random(3)
    never_settles = [rng.choice([1.0, 3.0]) for _ in range(100)]
    tracker = _run(never_settles, WindowRule(max_warmup_seconds=10.0, max_seconds=30.0))
    assert tracker.warmup_steps is not None and tracker.warmup_s < 13.0 and tracker.n >= 2
