"""`pitstop doctor` on a real Hugging Face Trainer run with max_steps: every finding with an estimate says the
time and money its fix would save over the steps the run had left (issue 30 item 4)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, causes, doctor, run_pitstop

pytestmark = pytest.mark.slow


def test_trainer_findings_carry_the_saving_over_the_steps_left(tmp_path: Path) -> None:
    doc, proc = doctor(
        tmp_path,
        sys.executable,
        str(SCRIPTS / "hf_trainer.py"),
        "--packed",
        "--slow-ms",
        "20",
        "--steps",
        "200",
        env={"PITSTOP_PRICE_PER_GPU_HOUR": "2.5"},
    )
    assert causes(doc)[0] == "dataloader_bound"
    env = doc["profile"]["ranks"][0]["environment"]
    assert (env["total_steps"], env["total_steps_from"], env["step_offset"]) == (
        200,
        "the Trainer's max_steps",
        0,
    )
    step_s = doc["metrics"]["step_time_s"]
    estimated = [f for f in doc["findings"] if f["est_speedup"] and f["est_speedup"] > 1]
    assert estimated and all(f["saving"] is not None for f in estimated)
    for f in estimated:
        s = f["saving"]
        # 3 warm-up + 12 measured steps done: 185 of 200 left, at the run's own median step time
        # a CPU run holds no GPU: its saving is wall time only, whatever the price says
        assert (s["remaining_steps"], s["total_steps"], s["gpus"]) == (185, 200, 0)
        assert s["step_s"] == pytest.approx(step_s, rel=1e-3)
        assert s["seconds"] == pytest.approx(185 * step_s * (1 - 1 / f["est_speedup"]), rel=0.01)
        assert s["gpu_hours"] == 0 and s["price_per_gpu_hour"] is None and s["money"] is None
    assert "Saved over the rest of the run: 185 of 200 steps left (the Trainer's max_steps)" in proc.stdout
    assert not any("length is unknown" in n for n in doc["notes"])


def test_a_plain_loop_needs_total_steps_and_says_so_once(tmp_path: Path) -> None:
    script = [sys.executable, str(SCRIPTS / "plain_loop.py"), "--pad-to", "256", "--steps", "60"]
    window = ["--quiet", "--warmup", "3", "--steps", "8", "--no-history"]
    out = tmp_path / "unknown.json"
    proc = run_pitstop("doctor", *window, "--json", str(out), "--", *script)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert "padding_waste" in causes(doc) and all(f["saving"] is None for f in doc["findings"])
    assert sum("the run's length is unknown" in n for n in doc["notes"]) == 1
    assert proc.stdout.count("the run's length is unknown") == 1  # said once, not per finding

    out = tmp_path / "given.json"
    given = ["--total-steps", "1000", "--price-per-gpu-hour", "4"]
    proc = run_pitstop("doctor", *window, *given, "--json", str(out), "--", *script)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    padding = next(f for f in doc["findings"] if f["cause"] == "padding_waste")
    s = padding["saving"]
    assert (s["remaining_steps"], s["total_steps"], s["length_from"]) == (989, 1000, "--total-steps")
    assert s["seconds"] > 0 and s["gpus"] == 0 and s["money"] is None  # wall time only on a CPU
    assert not any("length is unknown" in n for n in doc["notes"])
