"""Zero-code `pitstop doctor` on real plain-PyTorch trainings, one planted cause at a time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, causes, doctor_json

pytestmark = pytest.mark.slow


def test_slow_dataloader_ranks_first(tmp_path: Path) -> None:
    doc, _ = doctor_json(tmp_path, "plain_loop.py", "--packed", "--slow-ms", "60", "--steps", "100")
    assert causes(doc)[0] == "dataloader_bound"
    f = doc["findings"][0]
    # 8 × 60 ms of blocking reads per step: most of the step, even when a busy machine slows the compute
    assert f["evidence"]["data_wait_frac"] > 0.2
    assert f["evidence"]["num_workers"] == 0
    assert doc["environment"]["framework"] == "pytorch"
    assert doc["metrics"]["steps_measured"] == 12


@pytest.mark.smoke
def test_padding_waste_ranks_first(tmp_path: Path) -> None:
    doc, _ = doctor_json(tmp_path, "plain_loop.py", "--pad-to", "256", "--steps", "100")
    assert causes(doc)[0] == "padding_waste"
    f = doc["findings"][0]
    assert f["severity"] == "high"
    assert f["evidence"]["padding_frac"] > 0.6  # examples of 16-120 tokens in 256-token rows
    assert f["evidence"]["padded_row_len"] == 256
    assert doc["metrics"]["real_tokens_per_s"] < doc["metrics"]["tokens_per_s"]


def test_eager_attention_ranks_first(tmp_path: Path) -> None:
    doc, _ = doctor_json(tmp_path, "plain_loop.py", "--packed", "--attn", "eager", "--steps", "100")
    assert causes(doc)[0] == "slow_attention"
    assert doc["environment"]["attn_implementation"] == "eager"
    assert doc["findings"][0]["evidence"]["sdpa_calls_per_step"] == 0
    # eager and fused attention were timed in the job after its window, at its shapes, for the estimate
    timing = doc["profile"]["ranks"][0]["attention_timing"]
    assert timing["eager_s"] > 0 and timing["fused_s"] > 0 and timing["dtype"] == "float32"
    assert "timed on this CPU" in doc["findings"][0]["speedup_basis"]


def test_well_tuned_run_has_no_high_finding(tmp_path: Path) -> None:
    doc, _ = doctor_json(tmp_path, "plain_loop.py", "--packed", "--attn", "sdpa", "--steps", "100")
    assert [f for f in doc["findings"] if f["severity"] == "high"] == []
    assert doc["metrics"]["padding_frac"] < 0.1
    assert doc["environment"]["attention"]["sdpa_calls"] > 0


@pytest.mark.smoke
def test_explicit_watch_api_gives_the_same_diagnosis(tmp_path: Path) -> None:
    out = tmp_path / "watch.json"
    subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "plain_loop.py"),
            "--pad-to",
            "256",
            "--steps",
            "15",
            "--watch",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    doc = json.loads(out.read_text())
    assert doc["schema"] == "pitstop.run/1" and doc["source"] == "watch"
    assert causes(doc)[0] == "padding_waste"
    assert doc["metrics"]["steps_measured"] == 12


def test_steps_auto_ends_the_window_when_it_is_precise(tmp_path: Path) -> None:
    import json

    from tests.conftest import run_pitstop

    out = tmp_path / "auto.json"
    script = (sys.executable, str(SCRIPTS / "plain_loop.py"), "--steps", "2000")
    proc = run_pitstop(
        "doctor",
        "--quiet",
        "--steps",
        "auto",
        "--json",
        str(out),
        "--no-history",
        "--",
        *script,
        timeout=900,  # on a loaded machine the steps stay noisy and the window runs to its 300-step cap
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    rank = doc["profile"]["ranks"][0]
    assert rank["window_rule"] and doc["metrics"]["steps_measured"] >= 2
    assert rank["warmup_steps"] >= 2  # the first steps (start-up) are never measured
    assert "window:" in proc.stdout
