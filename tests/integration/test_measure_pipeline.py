"""The one measuring pipeline (runner.measure) that doctor and tune share, on real processes; and tune on a
pretraining loop whose batches carry no attention mask, which it used to refuse."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pitstop.diagnose import diagnose
from pitstop.runner.measure import StepWindow, measure
from pitstop.trials.request import FixRequest
from pitstop.tune.window import counted_in, run_window, throughput
from tests.conftest import SCRIPTS
from tests.factories import profile, steps

pytestmark = pytest.mark.slow
LOOP = [sys.executable, str(SCRIPTS / "dying_loop.py")]


def test_measure_hands_back_the_profile_the_death_and_the_output(tmp_path: Path) -> None:
    heard: list[int] = []
    result = measure(
        [*LOOP, "--die-by", "SIGSEGV", "--after", "9", "--steps", "100"],
        StepWindow(steps=50, warmup=3),
        on_step=heard.append,
        source="test",
    )
    assert result.exit_code == 139 and result.launch.exit_code == -11
    assert result.profile is not None and result.profile.source == "test"
    assert [len(r.steps) for r in result.profile.ranks] == [6]
    assert result.message is not None and "killed by SIGSEGV" in result.message
    assert not result.stopped_by_probe
    assert result.death == "was killed by SIGSEGV (a crash in native code)"
    assert not result.launch.out_dir.exists()  # its private folder is gone


def test_a_window_ends_where_the_probe_stops_it() -> None:
    result = measure([*LOOP, "--steps", "1000"], StepWindow(steps=6, warmup=2))
    assert result.stopped_by_probe and result.exit_code == 0 and result.message is None
    assert result.profile is not None and [len(r.steps) for r in result.profile.ranks] == [6]


def test_tune_measures_a_loop_without_attention_mask() -> None:
    # model(input_ids=x, labels=x) on full-length blocks, a model with no pad token: all tokens are real
    window = run_window([*LOOP, "--steps", "1000"], FixRequest(), steps=8, warmup=2, timeout_s=600)
    assert window.ok, window.error
    assert window.rate_of == "real tokens" and window.real_tokens_per_s is not None
    assert window.diagnosis is not None
    assert window.diagnosis.metrics.real_tokens_per_s == pytest.approx(window.diagnosis.metrics.tokens_per_s)


def test_a_window_killed_by_a_signal_says_so() -> None:
    window = run_window(
        [*LOOP, "--die-by", "SIGKILL", "--after", "4", "--steps", "100"], FixRequest(), 8, 2, 600
    )
    assert not window.ok and window.error == "the job was killed by SIGKILL (the OOM killer's way)"


def test_unknown_real_tokens_fall_back_to_what_is_known() -> None:
    p = profile("cpu", steps(n=10, wall=0.1, rows=4, row_len=100))
    for s in p.ranks[0].steps:
        s.real_tokens = None
    assert throughput(diagnose(p)) == (None, None)
    rate, _ = throughput(diagnose(counted_in(p, "tokens")))
    assert rate == pytest.approx(4000.0)
    rate, _ = throughput(diagnose(counted_in(p, "samples")))
    assert rate == pytest.approx(40.0)
    assert p.ranks[0].steps[0].real_tokens is None  # the profile itself is left as it was
