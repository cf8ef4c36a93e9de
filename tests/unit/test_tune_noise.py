"""Verdicts within the noise (issue 27, item 5), on synthetic window series: when identical baseline windows
disagree by more than the smallest effect the run resolves, a fix that shows no gain is undecided, tune names
the undecided fixes and the budget a quieter rerun needs, and never says "keep it as it is"; a clear gain is
still kept. Watch's "held steady" obeys the same rule."""

from __future__ import annotations

import math
import random

import pytest

from pitstop.core.profile import StepRecord
from pitstop.remedies import remedy
from pitstop.tune.budget import budget_for
from pitstop.tune.conclusion import no_gain_verdict, undecided
from pitstop.tune.session import TuneResult
from pitstop.tune.verdict import MIN_GAIN, UNDECIDED, Baseline, Verdict, judge, make_baseline
from pitstop.tune.window import Window
from pitstop.wholerun.run import WholeRun
from pitstop.wholerun.windows import WindowSpec

LOSSES = [6.9, 6.8, 6.7]
TOL = 1e-3


def window(rate: float, spread: float = 0.01, fix: str = "-") -> Window:
    w = Window(fixes=(fix,), real_tokens_per_s=rate, spread=spread, losses=list(LOSSES))
    w.applied = {fix: "done"}
    w.seconds = 40.0
    return w


def result(verdicts: list[Verdict], base: Baseline, rates: list[float]) -> TuneResult:
    return TuneResult(
        command=["python", "train.py"],
        baseline=base,
        baseline_window=window(rates[0]),
        verdicts=verdicts,
        best=None,
        not_tried=[],
        framework="pytorch",
        seconds=200.0,
        budget_s=600.0,
        redirected=[],
        undecided=undecided(verdicts, base, rates, window_s=40.0, first_s=45.0),
    )


def test_the_loaded_demo_baseline_is_too_noisy_to_call_any_fix_useless() -> None:
    """The issue's run: the baseline moved from 18,101 to 376 real tokens/s; every fix showed 'no gain'."""
    rates = [18101.0, 376.0]
    base = make_baseline([window(r, spread=0.05) for r in rates], TOL)
    assert base.disagreement == pytest.approx((18101 - 376) / ((18101 + 376) / 2))
    assert base.resolvable == pytest.approx(2 * math.sqrt(2) * 0.05)
    assert base.noisy
    verdicts = [
        judge(remedy(fix), "padding_waste", window(base.real_tokens_per_s * x, 0.05, fix), base, TOL)
        for fix, x in (("trim_padding", 0.97), ("pack_batch", 1.2), ("pack", 0.8))
    ]
    assert [v.status for v in verdicts] == [UNDECIDED] * 3
    assert all(not v.kept and "too noisy" in v.reason for v in verdicts)
    res = result(verdicts, base, rates)
    assert res.undecided is not None
    assert res.undecided.fixes == ["trim_padding", "pack_batch", "pack"]
    assert res.undecided.rerun_budget_s == pytest.approx(budget_for(3, 40.0, 45.0))
    text = no_gain_verdict(res)
    assert "keep it as it is" not in text
    assert "too noisy" in text and "376" in text and "18,101" in text
    # 45 s + 3 fixes and 2 baselines around them (after the first, closing) of 40 s, and a tenth: 4.5 min
    assert "--only trim_padding,pack_batch,pack --budget 5m" in text
    assert res.to_dict  # the JSON carries it too
    assert res.undecided.to_dict()["fixes"] == ["trim_padding", "pack_batch", "pack"]


def test_a_steady_machine_decides_and_may_say_keep_it_as_it_is() -> None:
    rates = [1000.0, 1004.0]
    base = make_baseline([window(r) for r in rates], TOL)
    assert not base.noisy and base.resolvable == pytest.approx(MIN_GAIN)
    v = judge(remedy("trim_padding"), "padding_waste", window(1010.0, fix="trim_padding"), base, TOL)
    assert v.status == "within noise"
    res = result([v], base, rates)
    assert res.undecided is None
    assert no_gain_verdict(res).endswith("keep it as it is.")


def test_a_gain_larger_than_the_noise_is_still_kept_and_a_clear_loss_still_slower() -> None:
    base = make_baseline([window(1000.0), window(1150.0)], TOL)  # 14% apart: noisy for a ±1% run
    assert base.noisy
    kept = judge(remedy("pack"), "padding_waste", window(2500.0, fix="pack"), base, TOL)
    assert kept.kept and kept.status == "kept"
    slower = judge(remedy("workers"), "dataloader_bound", window(500.0, fix="workers"), base, TOL)
    assert slower.status == "slower"
    small = judge(remedy("attention"), "slow_attention", window(1100.0, fix="attention"), base, TOL)
    assert small.status == UNDECIDED and "14%" in small.reason


def test_a_single_baseline_window_cannot_show_noise() -> None:
    base = make_baseline([window(1000.0)], TOL)
    assert base.disagreement is None and not base.noisy
    v = judge(remedy("trim_padding"), "padding_waste", window(1010.0, fix="trim_padding"), base, TOL)
    assert v.status == "within noise"


def test_imprecise_windows_resolve_less_so_their_own_spread_is_not_called_noise() -> None:
    """Two baselines 8% apart, each measured to ±4%: the run resolves only ~11%, so 8% is within it."""
    base = make_baseline([window(1000.0, 0.04), window(1080.0, 0.04)], TOL)
    assert base.resolvable == pytest.approx(2 * math.sqrt(2) * 0.04)
    assert not base.noisy


def _steps(n: int, sigma: float, seed: int) -> list[StepRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(1, n + 1):
        wall = 0.1 * math.exp(rng.gauss(0.0, sigma))
        out.append(
            StepRecord(
                index=i,
                wall_s=wall,
                data_wait_s=0.0,
                forward_s=wall / 3,
                backward_s=wall * 2 / 3,
                optimizer_s=0.0,
                micro_batches=1,
                samples=8,
                tokens=4096,
                real_tokens=4096,
                loss_tokens=4096,
                examples=8,
                seq_len=512,
            )
        )
    return out


def _watch(sigma: float) -> list[str]:
    run = WholeRun(WindowSpec(steps=20))
    run.add(0, _steps(400, sigma, seed=3))
    _, report = run.finish()
    return report.lines()


def test_watch_calls_a_run_steady_only_when_its_noise_would_have_shown_a_drop() -> None:
    steady = _watch(0.02)
    assert "no change: throughput and findings held steady through the run" in steady
    noisy = _watch(0.6)
    assert not any("held steady" in line for line in noisy)
    said = next(line for line in noisy if line.startswith("no change seen"))
    assert "too noisy" in said and "a drop of up to" in said
