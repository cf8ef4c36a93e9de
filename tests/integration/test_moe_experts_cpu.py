"""moe_experts_loop planted in a real tiny training under `pitstop doctor`: a Transformers Mixtral (32 experts,
top-2) loaded with experts_implementation="eager" loops over the experts, which take most of this CPU step;
pitstop names the implementation, the experts' share and the switch it timed. The same job with grouped_mm is
not flagged; a hand-written nn.ModuleList loop is named as one. tune's trial switches the model to grouped_mm
with the same losses. The asserts are on which cause and what evidence; the share bound is far below what the
planted loop takes (about 70% of the step on a CPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pitstop.diagnose.causes.moe_experts_loop import NOISY_CONFIDENCE
from tests.conftest import SCRIPTS, causes, doctor, run_pitstop

pytestmark = pytest.mark.slow

SCRIPT = SCRIPTS / "moe_eager.py"


def _run(tmp_path: Path, experts: str) -> dict:  # type: ignore[type-arg]
    folder = tmp_path / experts
    folder.mkdir()
    doc, _ = doctor(folder, sys.executable, str(SCRIPT), "--experts", experts, "--steps", "200", steps=8)
    return doc


def test_eager_experts_are_named_with_their_share_and_the_timed_switch(tmp_path: Path) -> None:
    doc = _run(tmp_path, "eager")
    f = next(f for f in doc["findings"] if f["cause"] == "moe_experts_loop")
    ev = f["evidence"]
    assert ev["implementation"] == "eager" and ev["experts"] == 32 and ev["experts_per_token"] == 2
    assert ev["layers"] == 2 and ev["site"].startswith("MixtralExperts")
    assert ev["experts_share"] > 0.3  # the loop takes most of the step: a 2x slower machine keeps the ratio
    assert ev["tokens_per_call"] == 8 * 64 and ev["grouped_speedup"] > 1.5
    assert f["est_speedup"] > 1.2
    # the switch's timing decides the confidence: calm pairs 0.9 or more, pairs timed under load flagged noisy
    if ev["timing_stable"]:
        assert f["confidence"] >= 0.9
    else:
        assert f["confidence"] == pytest.approx(NOISY_CONFIDENCE) and "noisy" in f["speedup_basis"]
    assert f["fix"]["remedies"][0]["id"] == "grouped_experts"
    assert 'experts_implementation="grouped_mm"' in f["fix"]["text"]
    rank = doc["profile"]["ranks"][0]
    assert rank["experts"]["implementation"] == "eager" and rank["experts"]["backward_calls"] > 0


def test_grouped_experts_are_not_flagged_and_a_hand_written_loop_is(tmp_path: Path) -> None:
    clean = _run(tmp_path, "grouped_mm")
    assert "moe_experts_loop" not in causes(clean)
    assert clean["profile"]["ranks"][0]["experts"]["implementation"] == "grouped_mm"
    looped = _run(tmp_path, "loop")
    f = next(f for f in looped["findings"] if f["cause"] == "moe_experts_loop")
    assert f["evidence"]["implementation"] == "loop" and f["evidence"]["site"] == "LoopedMoe (__main__)"
    assert f["evidence"]["experts_share"] > 0.2 and "nn.ModuleList" in f["summary"]


def test_tune_switches_the_experts_with_the_same_losses(tmp_path: Path) -> None:
    out = tmp_path / "tune.json"
    command = [sys.executable, str(SCRIPT), "--experts", "eager", "--steps", "100000"]
    proc = run_pitstop(
        "tune", "--no-history", "--json", str(out), "--only", "grouped_experts", "--budget", "3m", "--", *command,
        timeout=600, env={"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    (trial,) = doc["candidates"]
    assert trial["fix"] == "grouped_experts" and trial["cause"] == "moe_experts_loop"
    assert trial["applied"] == "MixtralForCausalLM: experts eager → grouped_mm"
    assert trial["preserves_computation"] and trial["loss_max_rel_diff"] < 1e-4
