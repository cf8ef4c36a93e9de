"""`pitstop doctor` and the Trainer callback on real Hugging Face Trainer / TRL trainings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, causes, doctor_json

pytestmark = pytest.mark.slow


def test_trainer_slow_dataloader(tmp_path: Path) -> None:
    doc, _ = doctor_json(tmp_path, "hf_trainer.py", "--packed", "--slow-ms", "20", "--steps", "100")
    assert doc["environment"]["framework"] == "hf_trainer"
    assert causes(doc)[0] == "dataloader_bound"
    f = doc["findings"][0]
    assert "dataloader_num_workers" in f["fix"]["snippets"]["hf_trainer"]
    assert f["fix"]["framework"] == "hf_trainer"
    assert doc["environment"]["micro_batch_size"] == 8


def test_trainer_padding_and_eager(tmp_path: Path) -> None:
    doc, _ = doctor_json(tmp_path, "hf_trainer.py", "--pad-to", "256", "--attn", "eager", "--steps", "100")
    assert causes(doc)[:2] == ["padding_waste", "slow_attention"]
    assert doc["environment"]["model"]["model_type"] == "llama"


def test_trl_sft_trainer_is_recognized(tmp_path: Path) -> None:
    doc, _ = doctor_json(tmp_path, "hf_trainer.py", "--trl", "--pad-to", "256", "--steps", "100")
    assert doc["environment"]["framework"] == "trl"
    assert causes(doc)[0] == "padding_waste"
    assert "SFTConfig" in doc["findings"][0]["fix"]["snippets"]["trl"]


@pytest.mark.smoke
def test_trainer_callback(tmp_path: Path) -> None:
    out = tmp_path / "callback.json"
    subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "hf_trainer.py"),
            "--pad-to",
            "256",
            "--steps",
            "15",
            "--callback",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    doc = json.loads(out.read_text())
    assert doc["source"] == "callback"
    assert doc["environment"]["framework"] == "hf_trainer"
    assert causes(doc)[0] == "padding_waste"
    assert doc["metrics"]["steps_measured"] == 12
