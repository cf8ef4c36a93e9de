"""The new causes that a CPU can produce, planted in real tiny trainings under `pitstop doctor`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import causes, doctor_json

pytestmark = pytest.mark.slow


def test_checkpoint_saved_every_other_step_is_a_stall(tmp_path: Path) -> None:
    # one torch thread, so the compute stays small beside a ~30 MB checkpoint even on a busy machine
    args = (
        "--save-every",
        "2",
        "--hidden",
        "256",
        "--batch",
        "1",
        "--short",
        "--threads",
        "1",
        "--steps",
        "100",
    )
    doc, _ = doctor_json(tmp_path, "cpu_causes.py", *args)
    assert "checkpoint_stall" in causes(doc)
    f = next(f for f in doc["findings"] if f["cause"] == "checkpoint_stall")
    ev = f["evidence"]
    assert ev["checkpoints"] == 6 and ev["steps_per_save"] == 2  # 12 measured steps
    assert ev["calls"] == {
        "save_pretrained": 6,
        "torch.save": 6,
    }  # safetensors inside save_pretrained: not twice
    assert ev["save_frac"] > 0.05
    assert "save" in f["fix"]["text"].lower()


def test_no_saves_no_stall(tmp_path: Path) -> None:
    doc, _ = doctor_json(
        tmp_path,
        "cpu_causes.py",
        "--hidden",
        "256",
        "--batch",
        "1",
        "--short",
        "--threads",
        "1",
        "--steps",
        "100",
    )
    assert "checkpoint_stall" not in causes(doc)
    assert doc["profile"]["ranks"][0]["checkpoints"]["saves"] == 0
