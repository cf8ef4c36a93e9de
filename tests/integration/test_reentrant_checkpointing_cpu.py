"""reentrant_checkpointing planted in a real two-rank FSDP job (torchrun, gloo): a LoRA fine-tune of a tiny Llama
whose decoder layers are checkpointed reentrant around whole FSDP units. pitstop counts the all-gathers the
recompute repeats and names the checkpoint_wrapper call; the job computes the same losses as without pitstop.
The same job checkpointed by Transformers (reentrant, but inside each unit) or non-reentrant is not flagged, and
tune's trial makes every call non-reentrant with the same losses and 9 all-gathers a step instead of 13. The
asserts are on which cause and what evidence (counts), not on a share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, causes, doctor

pytestmark = pytest.mark.slow
pytest.importorskip("peft")

TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2")
SCRIPT = SCRIPTS / "reentrant_fsdp.py"
STEPS = 8


def _gathers_per_step(rank: dict) -> float:  # type: ignore[type-arg]
    return sum(1 for c in rank["collectives"] if c["op"] == "all_gather") / len(rank["steps"])


def _rank_lines(prefix: Path) -> list[list[str]]:
    return [Path(f"{prefix}.rank{rank}").read_text().splitlines() for rank in (0, 1)]


def test_reentrant_checkpoints_around_fsdp_units_are_named_with_the_repeated_gathers(tmp_path: Path) -> None:
    probed, plain = tmp_path / "probed", tmp_path / "plain"
    doc, _ = doctor(tmp_path, *TORCHRUN, str(SCRIPT), "--steps", "40", "--losses", str(probed), steps=STEPS)
    f = next(f for f in doc["findings"] if f["cause"] == "reentrant_checkpointing")
    ev = f["evidence"]
    assert ev["reentrant_calls"] == 4 * STEPS and ev["non_reentrant_calls"] == 0  # four layers a step
    assert ev["repeated_all_gathers_per_step"] == 4 and ev["all_gathers_per_step"] == 13
    assert ev["checkpoint_called_from"].startswith(
        "torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py:"
    )
    assert ev["median_all_gather_ms"] > 0 and f["est_speedup"] > 1.0 and f["confidence"] == 0.8
    assert f["fix"]["remedies"][0]["id"] == "non_reentrant_checkpointing"
    assert "CheckpointImpl.REENTRANT" in f["fix"]["text"]
    for rank in doc["profile"]["ranks"]:
        assert rank["environment"]["checkpoint_reentrant"] is True
        assert rank["checkpointing"]["regathers"] == rank["checkpointing"]["reentrant"] == 4 * STEPS
    # the collector hands every call on: each rank computes the same losses as without pitstop
    subprocess.run([*TORCHRUN, str(SCRIPT), "--steps", "12", "--losses", str(plain)], check=True, timeout=300)
    for seen, alone in zip(_rank_lines(probed), _rank_lines(plain), strict=True):
        n = min(len(seen), len(alone))
        assert n >= STEPS and seen[:n] == alone[:n]


def test_reentrant_inside_each_unit_and_the_non_reentrant_job_are_not_flagged(tmp_path: Path) -> None:
    (tmp_path / "hf").mkdir()
    (tmp_path / "non").mkdir()
    hf, _ = doctor(tmp_path / "hf", *TORCHRUN, str(SCRIPT), "--impl", "hf", steps=STEPS)
    assert "reentrant_checkpointing" not in causes(hf)
    for rank in hf["profile"]["ranks"]:  # reentrant, but Transformers keeps each unit's hooks outside it
        assert rank["checkpointing"]["reentrant"] == 4 * STEPS and rank["checkpointing"]["regathers"] == 0
        assert rank["checkpointing"]["site"].startswith("transformers/")
        assert _gathers_per_step(rank) == 9
    non, _ = doctor(tmp_path / "non", *TORCHRUN, str(SCRIPT), "--impl", "non-reentrant", steps=STEPS)
    assert "reentrant_checkpointing" not in causes(non)
    for rank in non["profile"]["ranks"]:
        assert rank["checkpointing"]["non_reentrant"] == 4 * STEPS and rank["checkpointing"]["reentrant"] == 0
        assert rank["environment"]["checkpoint_reentrant"] is False and _gathers_per_step(rank) == 9


def test_the_trial_checkpoints_non_reentrant_with_the_same_losses_and_fewer_gathers() -> None:
    from pitstop.trials.request import FixRequest
    from pitstop.tune.window import run_window

    command = [*TORCHRUN, str(SCRIPT)]
    base = run_window(command, FixRequest(loss_steps=6), steps=6, warmup=2, timeout_s=300)
    fixed = run_window(
        command,
        FixRequest(fixes=frozenset({"non_reentrant_checkpointing"}), loss_steps=6),
        steps=6,
        warmup=2,
        timeout_s=300,
    )
    assert "run as use_reentrant=False" in fixed.applied["non_reentrant_checkpointing"]
    assert fixed.diagnosis is not None and base.diagnosis is not None
    for rank in fixed.diagnosis.profile.ranks:  # the probe counts the variant that ran
        assert rank.checkpointing is not None and rank.checkpointing.reentrant == 0
        assert rank.checkpointing.non_reentrant > 0
    assert "reentrant_checkpointing" in [f.cause for f in base.diagnosis.findings]
    assert "reentrant_checkpointing" not in [f.cause for f in fixed.diagnosis.findings]
    assert len(base.losses) == 6 and fixed.losses == pytest.approx(base.losses, rel=1e-6)
