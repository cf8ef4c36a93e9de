"""Issue 42: ``pitstop attach`` on the newcomer's Trainer job (``tests/scripts/newcomer_trainer.py``: every
example padded to ``max_length``, eager attention) started outside pitstop. Its stacks show transformers'
``eager_attention_forward`` in the forward and the script's ``padding="max_length"`` line is in the file its
frames name: the report names both (slow_attention and padding_waste, each marked sampled), and its headline is
not "No finding"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "scripts" / "newcomer_trainer.py"
PY_SPY = Path(sys.executable).parent / "py-spy"


def _wait_training(job: subprocess.Popen[str]) -> None:
    """Lines up to the Trainer's first logged loss (the loop is running), then a moment more."""
    assert job.stdout is not None
    seen = []
    deadline = time.monotonic() + 240
    for line in job.stdout:
        seen.append(line)
        if "'loss'" in line or '"loss"' in line:
            time.sleep(1.0)
            return
        if time.monotonic() > deadline:
            break
    raise AssertionError("the job did not log a loss:\n" + "".join(seen[-40:]))


@pytest.mark.slow
@pytest.mark.skipif(not PY_SPY.exists(), reason="py-spy is not installed (pip install 'pitstop[attach]')")
def test_attach_names_the_eager_attention_and_the_padding_its_stacks_show(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, str(JOB), "--steps", "100000"]  # lives through the window; stopped after it
    job = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path
    )
    out = tmp_path / "attach.json"
    try:
        _wait_training(job)
        done = subprocess.run(
            [sys.executable, "-m", "pitstop", "attach", str(job.pid), "--for", "8s", "--json", str(out)],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=ROOT,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert job.poll() is None  # the job ran on through the window
    finally:
        job.kill()
        job.communicate(timeout=60)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["source"] == "attach" and doc["environment"]["framework"] == "hf_trainer"
    findings = {f["cause"]: f for f in doc["findings"]}

    attention = findings["slow_attention"]
    ev = attention["evidence"]
    assert ev["view"] == "sampled" and ev["attn_implementation"] == "eager"
    assert any(
        f.endswith("modeling_llama.py in eager_attention_forward") for f in ev["eager_attention_frames"]
    )
    assert ev["sampled_share"] > 0 and ev["samples"] >= 200
    lo, hi = ev["sampled_ci95"]
    assert lo <= ev["sampled_share"] <= hi
    assert "of the sampled stacks" in attention["summary"] and "Sampled, not timed" in attention["summary"]
    assert attention["confidence"] < 0.95  # below what doctor gives the same config
    assert attention["fix"]["remedies"][0]["id"] == "attention"

    padding = findings["padding_waste"]
    pev = padding["evidence"]
    assert pev["view"] == "sampled" and pev["padding_frac"] is None  # the pad share is in no stack
    assert pev["max_length_padding"] and pev["max_length_padding"][0].startswith(f"{JOB}:")
    assert "pitstop doctor" in padding["summary"]

    terminal = done.stdout
    assert "No finding" not in terminal
    assert "Eager (unfused) attention" in terminal and "Compute spent on padding" in terminal
