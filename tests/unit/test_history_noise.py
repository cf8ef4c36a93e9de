"""``history check`` never claims more than the runs' own noise allows: two runs whose measured spreads cannot
resolve the allowed drop are 'undecided', not 'ok' (issue 27 item 5)."""

from __future__ import annotations

from typing import Any

from pitstop.history.compare import check, resolvable_drop
from pitstop.history.store import RunRecord


def record(run_id: int, rate: float, spread: float | None) -> RunRecord:
    result: dict[str, Any] = {"metrics": {"throughput_spread": spread}}
    return RunRecord(
        id=run_id, created_at="2026-12-04", kind="doctor", label=None, git_commit=None, command=None,
        fingerprint="f", fingerprint_fields={}, real_tokens_per_s=rate, tokens_per_s=rate,
        step_time_s=None, mfu=None, result=result,
    )  # fmt: skip


def test_quiet_runs_within_the_allowance_are_ok() -> None:
    verdict = check(record(2, 980.0, 0.005), record(1, 1000.0, 0.006), "real_tokens_per_s", 0.05)
    assert not verdict.regression and not verdict.undecided
    assert "noise" not in verdict.message()


def test_noisy_runs_cannot_say_ok() -> None:
    # spreads of 4% and 5%: the difference resolves only 2·√(0.04² + 0.05²) ≈ 13%, more than the 5% allowed
    verdict = check(record(2, 980.0, 0.04), record(1, 1000.0, 0.05), "real_tokens_per_s", 0.05)
    assert verdict.undecided and not verdict.regression
    assert verdict.noise is not None and 0.12 < verdict.noise < 0.14
    assert "cannot tell a drop of 5% from noise" in verdict.message()


def test_a_drop_past_the_allowance_inside_the_noise_is_still_a_regression_to_confirm() -> None:
    verdict = check(record(2, 900.0, 0.04), record(1, 1000.0, 0.05), "real_tokens_per_s", 0.05)
    assert verdict.regression and not verdict.undecided
    assert "rerun both longer" in verdict.message()


def test_runs_without_a_measured_spread_are_judged_as_before() -> None:
    assert resolvable_drop(record(2, 1.0, None), record(1, 1.0, 0.01)) is None
    verdict = check(record(2, 990.0, None), record(1, 1000.0, None), "real_tokens_per_s", 0.05)
    assert verdict.noise is None and not verdict.undecided and not verdict.regression
