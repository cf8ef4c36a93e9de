"""Whole-run analysis on synthetic step series: windows, changes at the right step with the right part, periodic
stalls by their period, no false change on a steady noisy run, bounded memory, the series on disk."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pitstop.core.profile import Environment, StepRecord
from pitstop.wholerun.changes import change_point
from pitstop.wholerun.periodic import StallLog, find_stalls, periodic_stalls
from pitstop.wholerun.run import WholeRun
from pitstop.wholerun.store import SeriesStore
from pitstop.wholerun.windows import Windower, WindowSpec

TOKENS = 8 * 512


def step(
    i: int, rng: random.Random, data: float = 0.002, other: float = 0.001, noise: float = 0.05
) -> StepRecord:
    """A CPU-like step: 0.1 s of compute with ±noise jitter, plus data wait and time between steps."""
    jitter = 1.0 + rng.gauss(0.0, noise)
    fwd, bwd, opt = 0.03 * jitter, 0.06 * jitter, 0.01 * jitter
    return StepRecord(
        index=i,
        wall_s=data + fwd + bwd + opt + other,
        data_wait_s=data,
        forward_s=fwd,
        backward_s=bwd,
        optimizer_s=opt,
        micro_batches=1,
        samples=8,
        tokens=TOKENS,
        real_tokens=TOKENS,
        loss_tokens=TOKENS,
        examples=8,
        seq_len=512,
    )


def series(
    n: int,
    seed: int = 0,
    slow_after: int | None = None,
    eval_every: int | None = None,
    save_every: int | None = None,
) -> list[StepRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(1, n + 1):
        data = 0.002 + (0.08 if slow_after is not None and i > slow_after else 0.0)
        other = 0.001
        if eval_every and i % eval_every == 0:
            other += 0.6
        if save_every and i % save_every == 0:
            other += 0.35
        out.append(step(i, rng, data=data, other=other))
    return out


def watch(records: list[StepRecord], spec: WindowSpec, chunk: int = 37, **kw: object) -> WholeRun:
    run = WholeRun(spec, **kw)  # type: ignore[arg-type]
    env = Environment(device="cpu", framework="pytorch")
    for start in range(0, len(records), chunk):
        run.add(0, records[start : start + chunk], env if start == 0 else None)
    return run


def test_windows_cut_every_n_steps_and_by_time() -> None:
    w = Windower(WindowSpec(steps=50))
    closed = w.add(0, series(120))
    assert [(c.first_step, c.last_step) for c in closed] == [(1, 50), (51, 100)]
    assert [(c.first_step, c.last_step) for c in w.finish()] == [(101, 120)]
    timed = Windower(WindowSpec(steps=1000, seconds=2.0))  # ~0.1 s a step: about 20 steps a window
    sizes = [c.steps for c in timed.add(0, series(100))]
    assert sizes and all(18 <= s <= 22 for s in sizes)


def test_ranks_that_arrive_one_after_the_other_are_windowed_together() -> None:
    """The current runner hands a rank's steps over when its process ends: rank 0's all first."""
    env = Environment(device="cpu", world_size=2)
    w = Windower(WindowSpec(steps=50))
    assert w.add(0, series(200), env) == []  # rank 1 not yet seen: nothing closes
    closed = w.add(1, series(200, seed=1, slow_after=120), env) + w.finish()
    assert [(c.first_step, c.last_step) for c in closed] == [(1, 50), (51, 100), (101, 150), (151, 200)]
    assert closed[0].tokens_per_s == pytest.approx(2 * TOKENS / 0.102, rel=0.1)
    assert "straggler" in [f.cause for f in closed[3].findings]
    assert "straggler" not in [f.cause for f in closed[0].findings]


def test_a_window_closes_only_when_every_rank_has_passed_it() -> None:
    w = Windower(WindowSpec(steps=20), {0: Environment(world_size=2)})
    assert w.add(1, series(10, seed=1)) == []
    assert w.add(0, series(30)) == []  # rank 1 is still at step 10
    closed = w.add(1, series(30, seed=1)[10:])
    assert len(closed) == 1 and closed[0].last_step == 20
    assert closed[0].tokens_per_s == pytest.approx(2 * TOKENS / 0.102, rel=0.1)  # two ranks' rates summed


def test_a_window_is_diagnosed_by_the_doctors_rules() -> None:
    records = series(100, slow_after=0)  # data wait ~44% of every step
    summary = Windower(WindowSpec(steps=100)).add(0, records, Environment(device="cpu"))[0]
    assert summary.data_wait_frac == pytest.approx(0.082 / 0.183, rel=0.1)
    assert "dataloader_bound" in [f.cause for f in summary.findings]


def test_a_dataloader_that_slows_after_step_n_is_one_change_at_that_step() -> None:
    run = watch(series(1000, slow_after=430), WindowSpec(steps=100))
    _, report = run.finish()
    slower = [c for c in report.changes if c.kind == "slower"]
    assert len(slower) == 1, [c.text for c in report.changes]
    change = slower[0]
    assert 428 <= change.step <= 433  # the step after the last fast one
    assert change.part == "data_wait_s"
    assert (
        change.before
        and change.after
        and change.after / change.before == pytest.approx(0.102 / 0.183, rel=0.1)
    )
    assert "data wait went from" in change.text
    new = [c for c in report.changes if c.kind == "new_finding"]
    assert [c.cause for c in new] == ["dataloader_bound"]
    assert 428 <= new[0].step <= 433  # placed at the shift inside its window, not at the window's start
    assert len(report.phases) == 2 and report.phases[1].first_step == 401


def test_evaluation_and_checkpoint_stalls_are_found_by_their_period_not_as_changes() -> None:
    run = watch(series(2000, seed=3, eval_every=150, save_every=400), WindowSpec(steps=200))
    _, report = run.finish()
    assert [c for c in report.changes if c.kind in ("slower", "faster")] == []
    by_period = {s.period: s for s in report.stalls}
    assert set(by_period) == {150, 400}, [s.describe() for s in report.stalls]
    assert by_period[150].first_step == 150 and len(by_period[150].steps) == 13
    assert by_period[150].part == "other_s" and by_period[150].mean_excess_s == pytest.approx(0.6, abs=0.1)
    assert by_period[400].mean_excess_s == pytest.approx(
        0.35, abs=0.1
    )  # 1200 coincides with an eval: still found


def test_a_configured_period_names_the_stall() -> None:
    run = WholeRun(WindowSpec(steps=100))
    run.add(0, series(600, eval_every=50), Environment(device="cpu", eval_steps=50, save_steps=500))
    _, report = run.finish()
    assert [s.label for s in report.stalls] == ["evaluation (every 50 steps as configured)"]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_steady_noisy_run_of_2000_steps_has_no_change(seed: int) -> None:
    rng = random.Random(100 + seed)
    records = series(2000, seed=seed)
    for r in records:  # plus the odd lone hiccup a shared machine gives
        if rng.random() < 0.01:
            r.wall_s *= 2.5
    _, report = watch(records, WindowSpec(steps=100)).finish()
    assert report.changes == [], [c.text for c in report.changes]
    assert report.stalls == []
    assert len(report.windows) == 20 and report.steps == 2000


def test_lone_stalls_without_a_period_are_no_periodic_stall() -> None:
    records = series(1000)
    for i in (97, 310, 311, 702, 950):
        records[i - 1].wall_s += 0.5
    log = StallLog()
    for start in range(0, 1000, 100):
        log.add(records[start : start + 100])
    assert sorted(s.step for s in log.stalls) == [97, 310, 311, 702, 950]
    assert periodic_stalls(log) == []


def test_change_point_finds_the_shift() -> None:
    records = series(200, slow_after=137)
    assert change_point(records) == 138
    assert find_stalls(series(200)) == []  # a steady series has no stall


def test_memory_is_bounded_and_the_series_is_on_disk(tmp_path: Path) -> None:
    run = watch(series(3000, slow_after=2000), WindowSpec(steps=100), series_dir=tmp_path)
    assert all(len(q) < 100 for q in run._queues.values()) and all(
        len(q) < 100 for q in run.windower._pending.values()
    )
    _, report = run.finish()
    store = SeriesStore(tmp_path)
    back = list(store.read(0))
    assert [s.index for s in back] == list(range(1, 3001))
    assert back[2500].data_wait_s == pytest.approx(0.082)
    assert store.path(0).stat().st_size < 3000 * 120  # compressed: well under the JSON's ~300 bytes a step
    assert report.series_path == str(tmp_path)


def test_a_steady_series_has_no_change_point() -> None:
    for seed in range(5):
        assert change_point(series(200, seed=seed)) is None


def test_a_burst_of_load_for_one_window_is_no_change_but_a_lasting_one_is() -> None:
    burst = series(1000)
    for r in burst[400:500]:  # another job shares the machine for one window: every part 30% slower
        r.wall_s *= 1.3
        r.forward_s, r.backward_s = (r.forward_s or 0) * 1.3, (r.backward_s or 0) * 1.3
    _, report = watch(burst, WindowSpec(steps=100)).finish()
    assert report.changes == []
    lasting = series(1000)
    for r in lasting[400:]:
        r.wall_s *= 1.3
        r.backward_s = (r.backward_s or 0) + r.wall_s * 0.3 / 1.3
    _, report = watch(lasting, WindowSpec(steps=100)).finish()
    (change,) = report.changes
    assert change.kind == "slower" and change.part == "backward_s" and 399 <= change.step <= 403


def test_a_burst_of_load_right_before_a_lasting_slowdown_is_not_a_change_of_its_own() -> None:
    # The busy CI machine's case: a window 22% slower from load, then the dataloader turns slow. The burst's
    # window must not be confirmed by the real drop after it (both are "slower"): one change, at the real
    # onset, its size measured from the steady baseline, and no second change against the burst's level.
    records = series(1000, slow_after=500)
    for r in records[400:500]:
        r.wall_s *= 1.25
        r.forward_s, r.backward_s = (r.forward_s or 0) * 1.25, (r.backward_s or 0) * 1.25
    _, report = watch(records, WindowSpec(steps=100)).finish()
    slower = [c for c in report.changes if c.kind == "slower"]
    assert len(slower) == 1, [c.text for c in report.changes]
    (change,) = slower
    assert 499 <= change.step <= 503 and change.part == "data_wait_s"
    assert change.before and change.after
    assert change.after / change.before == pytest.approx(0.102 / 0.183, rel=0.1)


def test_a_slowdown_in_two_stages_is_one_change_from_the_old_level() -> None:
    # data wait grows by 0.04 s for one window, then by 0.16 s for good: the first stage is not confirmed by
    # the second (another level), and the half-way window must not join the baseline, where it would hide it
    records = series(1000)
    for r in records[400:]:
        extra = 0.04 if r.index <= 500 else 0.16
        r.data_wait_s = (r.data_wait_s or 0) + extra
        r.wall_s += extra
    _, report = watch(records, WindowSpec(steps=100)).finish()
    slower = [c for c in report.changes if c.kind == "slower"]
    assert len(slower) == 1, [c.text for c in report.changes]
    (change,) = slower
    assert change.part == "data_wait_s" and change.before and change.after
    assert change.after / change.before == pytest.approx(0.103 / 0.263, rel=0.1)


def test_a_drop_just_past_the_bar_is_confirmed_by_a_window_just_under_it() -> None:
    # A drop near the bar: 55% against --min-drop 0.5, then 48% as a shared machine's load eases. Asking the
    # confirming window for the whole bar again lost the drop (only its finding was told) and put a slow window
    # into the baseline. Confirming asks for three quarters of it.
    records = series(1000)
    for r in records[400:]:
        extra = 0.126 if r.index <= 500 else 0.095  # the rate 55% lower, then 48% lower
        r.data_wait_s = (r.data_wait_s or 0) + extra
        r.wall_s += extra
    _, report = watch(records, WindowSpec(steps=100), min_drop=0.5).finish()
    slower = [c for c in report.changes if c.kind == "slower"]
    assert len(slower) == 1, [c.text for c in report.changes]
    assert 399 <= slower[0].step <= 403 and slower[0].part == "data_wait_s"
    assert [c.cause for c in report.changes if c.kind == "new_finding"] == ["dataloader_bound"]
    assert len(report.phases) == 2


def test_a_dataloader_drop_after_windows_that_moved_28_percent_is_found() -> None:
    # CI's failure: the machine ran two windows 28% slower than the two before (a spread of 24% in percent, a
    # bar of ±96% at four sigmas), then the dataloader's 83% drop was taken for noise and only its finding was
    # told. As factors, the same windows allow a drop of 62%.
    records = series(1000)
    for r in records:
        if 200 < r.index <= 400:
            r.forward_s, r.backward_s = (r.forward_s or 0) * 1.45, (r.backward_s or 0) * 1.45
            r.wall_s += 0.45 * 0.09
        if r.index > 400:
            r.data_wait_s = (r.data_wait_s or 0) + 0.5
            r.wall_s += 0.5
    _, report = watch(records, WindowSpec(steps=100), min_drop=0.5).finish()
    slower = [c for c in report.changes if c.kind == "slower"]
    assert len(slower) == 1, [c.text for c in report.changes]
    assert 399 <= slower[0].step <= 403 and slower[0].part == "data_wait_s"
    assert slower[0].after and slower[0].before and slower[0].after < 0.25 * slower[0].before


def test_a_slowdown_in_the_last_window_is_reported_unconfirmed() -> None:
    _, report = watch(series(500, slow_after=420), WindowSpec(steps=100)).finish()
    slower = [c for c in report.changes if c.kind == "slower"]
    assert len(slower) == 1 and "no later window to confirm it" in slower[0].text


def test_a_finding_that_gets_worse_is_one_change() -> None:
    records = series(1000)
    for r in records:  # rows padded more from step 501 on (a new data source with shorter examples)
        r.real_tokens = r.loss_tokens = int(TOKENS * (0.75 if r.index <= 500 else 0.4))
    _, report = watch(records, WindowSpec(steps=100)).finish()
    (worse,) = report.changes
    assert worse.kind == "worse" and worse.cause == "padding_waste" and worse.step == 501
    # the time saved is the padding share of what scales with tokens: forward + backward, 0.09 of a 0.103 s step
    share = 0.09 / 0.103
    assert worse.before == pytest.approx(share * 0.25, abs=0.03)
    assert worse.after == pytest.approx(share * 0.6, abs=0.03)


def test_hiccups_that_line_up_by_chance_but_cost_unlike_amounts_are_no_periodic_stall() -> None:
    records = series(600)
    for i, extra in ((100, 0.2), (200, 1.5), (300, 0.25), (400, 2.0), (500, 0.3)):
        records[i - 1].wall_s += extra
    log = StallLog()
    for start in range(0, 600, 100):
        log.add(records[start : start + 100])
    assert len(log.stalls) == 5 and periodic_stalls(log) == []
