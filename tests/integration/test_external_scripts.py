"""`pitstop doctor` on training scripts written independently of pitstop (tests/scripts/external), the way
users write them from tutorials: plain PyTorch, HF Trainer, TRL SFTTrainer, Accelerate."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, doctor

pytestmark = pytest.mark.slow

EXTERNAL = SCRIPTS / "external"


@pytest.mark.parametrize(
    ("script", "framework"),
    [
        ("plain_pytorch_gsm8k.py", "pytorch"),
        ("hf_trainer_alpaca.py", "hf_trainer"),
        ("trl_sft_alpaca.py", "trl"),
        ("accelerate_loop.py", "accelerate"),
    ],
)
def test_independent_scripts_are_diagnosed(
    shared_data: Path, tmp_path: Path, script: str, framework: str
) -> None:
    doc, _ = doctor(tmp_path, sys.executable, str(EXTERNAL / script), "--max-steps", "200", steps=10)
    env, m = doc["environment"], doc["metrics"]
    assert env["framework"] == framework
    assert m["steps_measured"] == 10
    assert m["tokens_per_s"] > 0 and m["real_tokens_per_s"] > 0
    assert 0.0 <= m["padding_frac"] < 1.0
    assert env["model"]["params_total"] > 0 and env["attn_implementation"] == "sdpa"
    assert env["dataloader"]["batch_size"] is not None
    for finding in doc["findings"]:
        assert finding["evidence"] and finding["fix"]["text"]
    if framework == "trl":
        assert env["gradient_checkpointing"] is True  # SFTConfig turns it on by default


def test_probe_arms_even_when_torch_is_looked_up_before_import(tmp_path: Path) -> None:
    """transformers and datasets call importlib.util.find_spec("torch") long before importing it."""
    script = tmp_path / "lookup_first.py"
    script.write_text(
        "import importlib.util\nassert importlib.util.find_spec('torch') is not None\n"
        "import torch\np = torch.nn.Parameter(torch.zeros(4))\nopt = torch.optim.SGD([p], lr=0.1)\n"
        "for _ in range(8):\n    (p ** 2).sum().backward(); opt.step(); opt.zero_grad()\n"
    )
    doc, _ = doctor(tmp_path, sys.executable, str(script), warmup=2, steps=4)
    assert doc["metrics"]["steps_measured"] == 4
