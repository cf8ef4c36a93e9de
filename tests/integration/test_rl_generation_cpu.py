"""rl_generation planted in a real TRL GRPOTrainer run under `pitstop doctor`: a tiny random Llama, 4-word prompts
and 96-token completions (min_new_tokens holds them at full length), so generate() takes most of every step on
any machine (about 85% here; the training forward and backward over the same tokens are a few percent each).
pitstop times the generation inside each step as its own phase, names the trainer and its rollout settings, and
the job computes the same losses and rewards as without pitstop (grad norms within their own run-to-run noise). The asserts are on which cause and
what evidence; the share is asserted only far from the rule's threshold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, doctor

pytestmark = pytest.mark.slow

SCRIPT = SCRIPTS / "grpo_generation.py"


def test_grpo_rollouts_are_timed_as_their_own_phase_and_named_with_losses_unchanged(tmp_path: Path) -> None:
    probed, plain = tmp_path / "probed.jsonl", tmp_path / "plain.jsonl"
    command = [sys.executable, str(SCRIPT), "--steps", "30", "--losses", str(probed)]
    doc, _ = doctor(tmp_path, *command, warmup=2, steps=6)
    f = next(f for f in doc["findings"] if f["cause"] == "rl_generation")
    ev = f["evidence"]
    assert ev["trainer"] == "GRPOTrainer" and ev["engine"] == "transformers generate"
    assert (ev["use_vllm"], ev["num_generations"], ev["max_completion_length"]) == (False, 4, 96)
    assert ev["generation_share"] > 0.5 and ev["training_share"] < ev["generation_share"]
    assert ev["generate_calls_per_step"] == 1.0 and ev["steps_generating"] == ev["steps_measured"] == 6
    assert ev["completions_per_step"] == 4 and ev["tokens_generated_per_step"] == 4 * 96
    assert f["confidence"] >= 0.9 and f["est_speedup"] is None
    assert (
        f["fix"]["remedies"][0]["id"] == "faster_generation"
        and "use_vllm=True" in f["fix"]["snippets"]["trl"]
    )
    # the GENERATE phase in the breakdown: every measured step timed it, and the parts still add up
    assert doc["metrics"]["generate_frac"] == pytest.approx(ev["generation_share"], abs=1e-3)
    (series,) = doc["step_series"]
    assert list(series["phases"])[:2] == ["data_wait_s", "generate_s"]
    for step in doc["profile"]["ranks"][0]["steps"]:
        parts = step["data_wait_s"] + step["generate_s"] + step["forward_s"] + step["backward_s"]
        assert step["generate_s"] > 0 and parts + step["optimizer_s"] <= step["wall_s"] + 1e-6
    # the watch hands every call on: the same losses and rewards as the job alone
    subprocess.run([sys.executable, str(SCRIPT), "--steps", "10", "--losses", str(plain)], check=True)
    seen = [json.loads(line) for line in probed.read_text().splitlines()]
    alone = [json.loads(line) for line in plain.read_text().splitlines()][: len(seen)]
    assert len(seen) >= 8 and [(loss, reward) for loss, _, reward in seen] == [(a, r) for a, _, r in alone]
    # the grad norm varies in its 4th digit between two runs of the job alone (CPU reduction order)
    assert [g for _, g, _ in seen] == pytest.approx([g for _, g, _ in alone], rel=1e-3)
