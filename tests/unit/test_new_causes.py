"""The causes beyond the guide's first ten: each rule on hand-made profiles, and its remedy's advice."""

from __future__ import annotations

import dataclasses

import pytest
from tests.factories import profile, steps

from pitstop.diagnose import diagnose
from pitstop.findings import Finding
from pitstop.profile import RunProfile, RunTotals, SaveStats
from pitstop.remedies import RemedyId, advise, remedy, use
from pitstop.trials.request import FixReport, FixRequest


def finding(p: RunProfile, cause: str) -> Finding | None:
    return next((f for f in diagnose(p).findings if f.cause == cause), None)


# -- checkpoint_stall ------------------------------------------------------------------------------------
def test_measured_saves_that_take_a_quarter_of_the_window_are_a_stall() -> None:
    p = profile("cpu", steps(n=20, wall=0.1), save_steps=5)
    p.ranks[0].checkpoints = SaveStats(
        saves=8, save_s=0.5, steps_with_saves=4, calls={"save_pretrained": 4, "torch.save": 4}
    )
    f = finding(p, "checkpoint_stall")
    assert f is not None
    assert f.evidence["save_frac"] == pytest.approx(0.25)
    assert f.evidence["checkpoints"] == 4 and f.evidence["steps_per_save"] == 5
    # save_steps 5 → 100: 95% of the save time goes
    assert f.est_speedup == pytest.approx(1 / (1 - 0.25 * 0.95), rel=1e-3)
    assert f.fix.uses[0].remedy is RemedyId.SAVE_LESS_OFTEN
    assert "save_steps=100" in (f.fix.snippet or "")


def test_saves_that_cost_little_or_none_are_no_finding() -> None:
    cheap = profile("cpu", steps(n=20, wall=0.1))
    cheap.ranks[0].checkpoints = SaveStats(saves=1, save_s=0.02, steps_with_saves=1)
    assert finding(cheap, "checkpoint_stall") is None
    none = profile("cpu", steps(n=20, wall=0.1))
    none.ranks[0].checkpoints = SaveStats()
    assert finding(none, "checkpoint_stall") is None


def test_trainer_outputs_give_an_estimate_labelled_as_one() -> None:
    # a 1.2B model saved 100 times in an hour: 100 × 12 bytes × 1.24e9 / 1 GB/s ≈ 1480 s of 3600
    p = RunProfile(
        source="trainer_state",
        totals=RunTotals(train_s=3600.0, steps=1000, saves=100),
        run_environment=dataclasses.replace(profile().environment, save_steps=10, device=None),
    )
    f = finding(p, "checkpoint_stall")
    assert f is not None and f.confidence < 0.5
    assert f.evidence["estimated_save_frac"] == pytest.approx(100 * 12 * 1_235_814_400 / 1e9 / 3600, rel=1e-3)
    assert "estimate" in f.speedup_basis and "estimate" in f.summary
    rare = dataclasses.replace(p, totals=RunTotals(train_s=3600.0, steps=1000, saves=1))
    assert finding(rare, "checkpoint_stall") is None


def test_tune_raises_the_trainers_save_steps() -> None:
    class Args:
        save_strategy = "steps"
        save_steps = 10

    report = FixReport(None)
    args = Args()
    remedy(RemedyId.SAVE_LESS_OFTEN).rewrite_training_args(args, FixRequest(), report)
    assert args.save_steps == 100
    assert report.params[RemedyId.SAVE_LESS_OFTEN] == {"save_steps": 10}
    kept = advise("hf_trainer", use(RemedyId.SAVE_LESS_OFTEN, **report.params[RemedyId.SAVE_LESS_OFTEN]))
    assert "every 100 steps instead of 10" in kept.text
    never = Args()
    never.save_strategy = "no"
    remedy(RemedyId.SAVE_LESS_OFTEN).rewrite_training_args(never, FixRequest(), report)
    assert never.save_steps == 10
