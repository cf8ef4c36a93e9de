"""per_step_cleanup planted in real tiny trainings under `pitstop doctor`: a plain loop that calls
``gc.collect()`` (and ``torch.cuda.empty_cache()``) after every step while it holds a big Python heap, and a
Hugging Face Trainer whose ``TrainerCallback.on_step_end`` does the same. pitstop names the call, the job's line
and the steps it was made in; gc_pauses does not claim the job's own collections; the same loop without the
calls is not flagged; the job computes the same losses with pitstop watching, and tune's trial (the calls let
through once in a few hundred) keeps the first losses bit for bit. Each collection traverses ~1 M objects
(~0.1-1 s here against a ~0.04-0.1 s step), so the asserts are on which cause and what evidence, not a share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pitstop.trials.request import FixRequest
from pitstop.tune.window import run_window
from tests.conftest import SCRIPTS, causes, doctor

pytestmark = pytest.mark.slow

LOOP = SCRIPTS / "cleanup_loop.py"
TRAINER = SCRIPTS / "cleanup_trainer.py"


def _line_of(script: Path, code: str) -> int:
    """The line whose code starts with ``code`` (not a docstring that mentions it)."""
    return next(
        i for i, line in enumerate(script.read_text().splitlines(), 1) if line.strip().startswith(code)
    )


def test_a_collection_every_step_is_named_with_its_line_and_losses_unchanged(tmp_path: Path) -> None:
    probed, plain = tmp_path / "probed.txt", tmp_path / "plain.txt"
    doc, _ = doctor(tmp_path, sys.executable, str(LOOP), "--steps", "30", "--losses", str(probed), steps=8)
    f = next(f for f in doc["findings"] if f["cause"] == "per_step_cleanup")
    (call,) = f["evidence"]["calls"]  # empty_cache() on a CPU costs nothing: not part of the finding
    assert call["call"] == "gc.collect" and call["steps"] == call["count"] == f["evidence"]["steps"] == 8
    assert call["site"] == f"{LOOP}:{_line_of(LOOP, 'gc.collect()')} in main" and call["via"] is None
    assert f["est_speedup"] > 1.5 and f["confidence"] >= 0.9 and f["evidence"]["gc_enabled"] is True
    assert call["site"] in f["fix"]["text"] and "gc.collect()" in f["fix"]["snippets"]["pytorch"]
    rank = doc["profile"]["ranks"][0]
    flushes = [c for c in rank["job_calls"] if c["call"] == "torch.cuda.empty_cache"]
    assert [c["site"] for c in flushes] == [f"{LOOP}:{_line_of(LOOP, 'torch.cuda.empty_cache()')} in main"]
    # the job's own collections are its calls, not the collector's pauses
    assert "gc_pauses" not in causes(doc)
    assert (
        rank["gc_pauses"]["generations"][2]["collections"]
        >= 8
        > rank["gc_pauses"]["automatic"][2]["collections"]
    )
    # the wrappers hand every call on: the job computes the same losses without pitstop
    subprocess.run([sys.executable, str(LOOP), "--steps", "30", "--losses", str(plain)], check=True)
    seen = probed.read_text().splitlines()
    assert len(seen) >= 8 and seen == plain.read_text().splitlines()[: len(seen)]


def test_the_loop_without_the_calls_is_not_flagged(tmp_path: Path) -> None:
    doc, _ = doctor(tmp_path, sys.executable, str(LOOP), "--steps", "30", "--collect-every", "0", steps=8)
    assert "per_step_cleanup" not in causes(doc) and doc["profile"]["ranks"][0]["job_calls"] == []


def test_a_trainer_callback_that_cleans_up_every_step_is_named_in_the_callback(tmp_path: Path) -> None:
    """A real Trainer (its setting torch_empty_cache_steps=1 too: on a CPU it calls nothing, so it is recorded
    in the environment and not blamed)."""
    doc, _ = doctor(
        tmp_path, sys.executable, str(TRAINER), "--steps", "30", "--empty-cache-steps", "1", steps=8
    )
    f = next(f for f in doc["findings"] if f["cause"] == "per_step_cleanup")
    (call,) = f["evidence"]["calls"]
    assert call["site"] == f"{TRAINER}:{_line_of(TRAINER, 'gc.collect()')} in on_step_end"
    assert call["steps"] == 8 and call["via"] is None and call["setting"] is None
    assert "TrainerCallback" in f["fix"]["snippets"]["hf_trainer"] and call["site"] in f["fix"]["text"]
    rank = doc["profile"]["ranks"][0]
    assert rank["environment"]["framework"] == "hf_trainer" and rank["environment"]["empty_cache_steps"] == 1
    assert all(c["via"] is None for c in rank["job_calls"])  # the Trainer emptied no cache on a CPU


def test_the_trial_lets_the_calls_through_rarely_and_keeps_the_losses(tmp_path: Path) -> None:
    command = [sys.executable, str(TRAINER), "--steps", "1000"]
    base = run_window(command, FixRequest(loss_steps=6), steps=6, warmup=2, timeout_s=600)
    trial = run_window(
        command,
        FixRequest(fixes=frozenset({"no_per_step_cleanup"}), loss_steps=6),
        steps=6,
        warmup=2,
        timeout_s=600,
    )
    assert base.ok and trial.ok, (base.error, trial.error)
    assert "no_per_step_cleanup" in trial.applied and "on_step_end" in trial.applied["no_per_step_cleanup"]
    calls = trial.applied_params["no_per_step_cleanup"]["calls"]
    assert {c["call"] for c in calls} == {"gc.collect", "torch.cuda.empty_cache"}
    assert len(base.losses) == len(trial.losses) == 6 and base.losses == trial.losses  # same computation
    assert base.diagnosis is not None and trial.diagnosis is not None
    assert "per_step_cleanup" in {f.cause for f in base.diagnosis.findings}
    assert "per_step_cleanup" not in {f.cause for f in trial.diagnosis.findings}
