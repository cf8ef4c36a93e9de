"""A loop that builds its own batches (no DataLoader) is counted from its model's inputs, and a loop whose
steps no ``Optimizer.step`` delimits (a closure is one that does; optimizer-in-backward and a hand-written
update do not) still has one step per iteration, with where the counts and the boundaries came from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SCRIPTS, doctor

pytestmark = pytest.mark.slow

SCRIPT = SCRIPTS / "own_batches" / "nanogpt_loop.py"
WARMUP, STEPS = 2, 6


def run(tmp_path: Path, *args: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(run document, its one rank's profile, what the script wrote) under ``pitstop doctor``."""
    out = tmp_path / "script.json"
    command = (sys.executable, str(SCRIPT), "--steps", "40", "--out", str(out), *args)
    doc, _ = doctor(tmp_path, *command, warmup=WARMUP, steps=STEPS)
    return doc, doc["profile"]["ranks"][0], json.loads(out.read_text())


@pytest.mark.smoke
def test_positional_model_x_y_counts_tokens_and_keeps_the_losses(tmp_path: Path) -> None:
    doc, rank, script = run(tmp_path)
    m = doc["metrics"]
    assert m["tokens_per_s"] > 0 and m["real_tokens_per_s"] == m["tokens_per_s"] and m["padding_frac"] == 0
    assert rank["tokens_counted_from"] == "model inputs" and rank["steps_delimited_by"] == "optimizer step"
    assert {s["tokens"] for s in rank["steps"]} == {8 * 64} and {s["loss_tokens"] for s in rank["steps"]} == {
        512
    }
    alone = tmp_path / "alone.json"
    cmd = [sys.executable, str(SCRIPT), "--steps", str(len(script["losses"])), "--out", str(alone)]
    subprocess.run(cmd, check=True, timeout=300)
    assert json.loads(alone.read_text())["losses"] == script["losses"]  # bit-identical


def test_padded_keyword_inputs_and_a_hand_written_update(tmp_path: Path) -> None:
    doc, rank, script = run(tmp_path, "--inputs", "padded", "--update", "manual")
    pad, built = script["padding"]
    assert doc["metrics"]["padding_frac"] == pytest.approx(pad / built, abs=0.08)  # 16-64 of 64 tokens: ~37%
    assert rank["tokens_counted_from"] == "model inputs"
    assert (
        rank["steps_delimited_by"] == "model forward"
        and "without an optimizer" in rank["step_boundary_reason"]
    )
    assert [s["micro_batches"] for s in rank["steps"]] == [1] * STEPS
    assert len(script["losses"]) >= WARMUP + STEPS  # a step closes at the next one's forward


@pytest.mark.parametrize(
    ("update", "boundary"), [("closure", "optimizer step"), ("in-backward", "model forward")]
)
def test_steps_without_one_optimizer_step_per_iteration(tmp_path: Path, update: str, boundary: str) -> None:
    _, rank, script = run(tmp_path, "--update", update)
    assert rank["steps_delimited_by"] == boundary
    # one batch of 8 x 64 tokens per step: not one step per parameter, not two iterations in one
    assert [(s["micro_batches"], s["tokens"]) for s in rank["steps"]] == [(1, 512)] * STEPS
    assert [s["index"] for s in rank["steps"]] == list(range(WARMUP + 1, WARMUP + STEPS + 1))
    assert len(script["losses"]) >= WARMUP + STEPS
