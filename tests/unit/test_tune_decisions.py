"""How tune decides from measured windows: speed-up with its uncertainty, the loss check, and which fixes
a diagnosis proposes."""

from __future__ import annotations

import pytest
from tests.factories import profile, steps

from pitstop.cli.errors import UserError
from pitstop.cli.tune import parse_budget, parse_fixes
from pitstop.core.profile import AttentionInfo, DataLoaderInfo
from pitstop.diagnose import diagnose
from pitstop.remedies import remedy
from pitstop.tune.proposals import exclusive, kept_change, propose, tunable
from pitstop.tune.verdict import judge, losses_match, make_baseline
from pitstop.tune.window import Window, counted_in, failure_line, throughput

LOSSES = [6.9, 6.8, 6.7]


def window(rate: float | None, spread: float = 0.01, fix: str = "trim_padding", **kw: object) -> Window:
    w = Window(fixes=(fix,), real_tokens_per_s=rate, spread=spread, losses=list(LOSSES))
    w.applied = {fix: "done"}
    for k, v in kw.items():
        setattr(w, k, v)
    return w


def base() -> object:
    return make_baseline([window(1000.0, fix="-"), window(1000.0, fix="-")], 1e-3)


def test_baseline_folds_drift_into_its_uncertainty() -> None:
    b = make_baseline([window(1000.0, 0.01), window(1100.0, 0.01)], 1e-3)
    assert b.real_tokens_per_s == pytest.approx(1050.0)
    assert b.drift == pytest.approx(0.1)
    assert b.spread == pytest.approx((0.01**2 + (50 / 1050) ** 2) ** 0.5)
    assert b.losses_reproducible is True


def test_a_clear_gain_is_kept_and_a_small_one_is_noise() -> None:
    c = remedy("trim_padding")
    kept = judge(c, "padding_waste", window(1500.0), base(), 1e-3)  # type: ignore[arg-type]
    assert kept.kept and kept.speedup == pytest.approx(1.5) and kept.status == "kept"
    noise = judge(c, "padding_waste", window(1020.0), base(), 1e-3)  # type: ignore[arg-type]
    assert not noise.kept and noise.status == "within noise"
    slower = judge(c, "padding_waste", window(800.0), base(), 1e-3)  # type: ignore[arg-type]
    assert slower.status == "slower"
    wide = judge(c, "padding_waste", window(1100.0, spread=0.2), base(), 1e-3)  # type: ignore[arg-type]
    assert not wide.kept  # +10% with ±20% is not a measured gain


def test_a_fix_that_should_preserve_losses_but_does_not_is_rejected() -> None:
    changed = window(2000.0, fix="attention", losses=[6.9, 6.5, 6.1])
    v = judge(remedy("attention"), "slow_attention", changed, base(), 1e-3)  # type: ignore[arg-type]
    assert not v.kept and v.status == "changed the losses" and v.loss_max_rel_diff > 0.05
    # packing whole examples changes the batches on purpose: its losses are shown, not held against it
    v = judge(remedy("pack"), "padding_waste", window(2000.0, fix="pack", losses=[6.5]), base(), 1e-3)  # type: ignore[arg-type]
    assert v.kept


def test_failed_and_inapplicable_trials_say_why() -> None:
    crashed = window(
        None, fix="micro_batch", error="out of memory: CUDA out of memory. Tried to allocate 2.00 GiB"
    )
    v = judge(remedy("micro_batch"), "small_batch", crashed, base(), 1e-3)  # type: ignore[arg-type]
    assert v.status == "out of memory" and not v.kept
    skipped = window(1000.0)  # the job ran, with nothing to apply the fix to
    skipped.applied, skipped.skipped = {}, {"group_by_length": "examples are not token ids"}
    v = judge(remedy("group_by_length"), "padding_waste", skipped, base(), 1e-3)  # type: ignore[arg-type]
    assert v.status == "not applicable" and v.reason == "examples are not token ids"


def test_losses_match_is_relative() -> None:
    assert losses_match([10.0, 5.0], [10.0001, 5.0], 1e-3) == (True, pytest.approx(1e-5))
    assert losses_match([], [1.0], 1e-3)[0] is False


def test_throughput_and_spread_from_steps() -> None:
    p = profile("cpu", steps(n=20, wall=0.1, real_frac=0.5))
    rate, spread = throughput(diagnose(p))
    real = p.ranks[0].steps[0].real_tokens
    assert rate == pytest.approx(real / 0.1)
    assert spread == pytest.approx(0.0, abs=1e-9)  # identical steps: no spread


def test_steps_per_second_when_nothing_is_counted_judge_only_fixes_that_keep_the_batch_shape() -> None:
    unknown = steps(n=20, wall=0.1)
    for s in unknown:
        s.tokens = s.real_tokens = s.samples = None
    rate, _ = throughput(diagnose(counted_in(profile("cpu", unknown), "steps")))
    assert rate == pytest.approx(10.0)  # one step every 0.1 s
    faster = window(15.0, fix="pin_memory", rate_of="steps")
    assert judge(remedy("pin_memory"), "pageable_copies", faster, base10(), 1e-3).kept  # type: ignore[arg-type]
    packed = judge(remedy("pack"), "padding_waste", window(15.0, fix="pack", rate_of="steps"), base10(), 1e-3)  # type: ignore[arg-type]
    assert packed.status == "not comparable" and not packed.kept and "batch shape" in packed.reason


def base10() -> object:
    return make_baseline([window(10.0, fix="-"), window(10.0, fix="-")], 1e-3)


def test_failure_line_prefers_the_exception(tmp_path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "log"
    log.write_text("step 1\nTraceback (most recent call last):\n  File x\nRuntimeError: shapes differ\n")
    assert failure_line(log) == "RuntimeError: shapes differ"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1 GiB\n")
    assert failure_line(log).startswith("out of memory")


def test_proposals_follow_the_findings() -> None:
    eager_padded_text = profile(
        "cpu",
        steps(wall=0.1, data=0.03, real_frac=0.4),
        attention=AttentionInfo(implementation="eager", sdpa_calls=0, sdpa_calls_with_mask=0),
        dataloader=DataLoaderInfo(num_workers=0, batch_size=8, examples_are_text=True),
    )
    fixes = [p.fix for p in propose(diagnose(eager_padded_text))]
    assert {"attention", "pretokenize", "workers", "trim_padding", "pack"} <= set(fixes)
    assert "bf16" not in fixes and "tf32" not in fixes  # GPU-only, and this is a CPU run
    only = [p.fix for p in propose(diagnose(eager_padded_text), only=["attention"])]
    assert only == ["attention"]
    tried = propose(diagnose(eager_padded_text), also=["no_checkpointing"], skip=["workers"])
    assert "no_checkpointing" in [p.fix for p in tried]
    assert "workers" not in [p.fix for p in tried]


def test_exclusive_fixes_and_changes_for_every_fix_and_framework() -> None:
    assert exclusive("pack", "trim_padding") and exclusive("trim_padding", "pack")
    assert not exclusive("attention", "workers")
    for fix in tunable():
        for fw in ("pytorch", "hf_trainer", "trl", "lightning", None):
            change = kept_change(fix, fw, None)
            assert change.text and change.snippet
    micro = kept_change("micro_batch", "hf_trainer", {"micro": 2, "accum": 4, "new_micro": 8, "new_accum": 1})
    assert (
        "per_device_train_batch_size=8" in micro.snippet and "gradient_accumulation_steps=1" in micro.snippet
    )


def test_cli_parsing_errors_are_one_line() -> None:
    assert parse_budget("10m") == 600 and parse_budget("90s") == 90 and parse_budget("1h") == 3600
    for bad in ("soon", "5s", "-1m"):
        with pytest.raises(UserError):
            parse_budget(bad)
    assert parse_fixes("--try", ["pack,attention", "workers"]) == ["pack", "attention", "workers"]
    with pytest.raises(UserError, match="unknown fix 'turbo'"):
        parse_fixes("--try", ["turbo"])


def test_budget_plan_says_what_it_covers_and_each_fix_meets_its_nearest_baselines() -> None:
    from pitstop.remedies import remedy
    from pitstop.tune.budget import bracketing, budget_plan, candidate_precision
    from pitstop.tune.proposals import Proposal

    proposals = [Proposal(remedy(f), "x", 2.0) for f in ("trim_padding", "attention", "workers", "pack")]
    scout = window(1000.0)
    scout.seconds = 100.0
    # the first fix and the baseline again after it (A/B/A), then two more fixes and a closing baseline
    plan = budget_plan(proposals, scout, left_s=520.0)
    assert plan.tried == ["trim_padding", "attention", "workers"] and plan.left_out == ["pack"]
    assert "need --budget" in plan.text and "pack" in plan.text
    assert candidate_precision(proposals[0]) == 0.08  # a ×2 fix is seen with ±8%
    assert candidate_precision(Proposal(remedy("workers"), "x", None)) == 0.04
    early, late = window(1000.0), window(1200.0)
    overall = make_baseline([early, late], 1e-3)
    near = bracketing([(0, early), (5, late)], 2, overall, 1e-3)
    assert near.real_tokens_per_s == 1100.0 and near.spread >= 0.09  # the drift between them is uncertainty
    only_before = bracketing([(0, early)], 2, overall, 1e-3)
    assert only_before.real_tokens_per_s == 1000.0
