"""debug_modes planted in a real tiny training under `pitstop doctor`: autograd's anomaly detection switched
on once before the loop, or entered around every step. pitstop names the mode and the job's own line, puts a
cost on it, and the job computes the same losses as without pitstop; the same loop without it is not flagged.
tune's debug_off trial keeps anomaly detection off and the debugging variables unset inside the trial process,
with the same losses. The asserts are on which cause and what evidence, not on a share (anomaly detection roughly doubles this
step on a CPU, far from the finding's threshold, which counts steps, not time)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, causes, doctor, run_pitstop

pytestmark = pytest.mark.slow

SCRIPT = SCRIPTS / "anomaly_loop.py"


def _line_of(text: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


def test_anomaly_detection_left_on_is_named_with_its_line_and_losses_unchanged(tmp_path: Path) -> None:
    probed, plain = tmp_path / "probed.txt", tmp_path / "plain.txt"
    doc, _ = doctor(tmp_path, sys.executable, str(SCRIPT), "--steps", "20", "--losses", str(probed), steps=8)
    f = next(f for f in doc["findings"] if f["cause"] == "debug_modes")
    ev = f["evidence"]
    assert ev["anomaly_detection_steps"] == ev["steps_measured"] == 8
    assert ev["anomaly_site"] == f"{SCRIPT}:{_line_of('set_detect_anomaly(True)')}"
    assert f["est_speedup"] > 1.3 and f["confidence"] >= 0.9
    assert f["fix"]["remedies"][0]["id"] == "debug_off" and ev["anomaly_site"] in f["fix"]["text"]
    # the collector wraps torch's switch and hands every call on: the job computes the same losses
    subprocess.run([sys.executable, str(SCRIPT), "--steps", "20", "--losses", str(plain)], check=True)
    seen = probed.read_text().splitlines()
    assert len(seen) >= 8 and seen == plain.read_text().splitlines()[: len(seen)]


def test_a_context_entered_every_step_counts_and_the_clean_loop_is_not_flagged(tmp_path: Path) -> None:
    (tmp_path / "per").mkdir()
    (tmp_path / "off").mkdir()
    doc, _ = doctor(
        tmp_path / "per", sys.executable, str(SCRIPT), "--anomaly", "per-step", "--steps", "20", steps=8
    )
    ev = next(f for f in doc["findings"] if f["cause"] == "debug_modes")["evidence"]
    assert ev["anomaly_detection_steps"] == 8
    assert ev["anomaly_site"] == f"{SCRIPT}:{_line_of('with around:')}"
    clean, _ = doctor(
        tmp_path / "off", sys.executable, str(SCRIPT), "--anomaly", "off", "--steps", "20", steps=8
    )
    assert "debug_modes" not in causes(clean)
    assert clean["profile"]["ranks"][0]["debug_modes"]["anomaly_steps"] == 0


def test_tune_keeps_debug_off_with_the_same_losses(tmp_path: Path) -> None:
    """tune's trial hands the job's set_detect_anomaly(True) over as off: the same losses, a measured gain
    (anomaly detection costs this small model about 4× its step on a CPU, far from the noise)."""
    out = tmp_path / "tune.json"
    command = [sys.executable, str(SCRIPT), "--steps", "100000"]
    proc = run_pitstop(
        "tune", "--no-history", "--json", str(out), "--only", "debug_off", "--budget", "3m", "--", *command,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    (trial,) = doc["candidates"]
    assert trial["fix"] == "debug_off" and trial["cause"] == "debug_modes" and trial["status"] == "kept"
    assert trial["speedup"] > 1.0 and trial["loss_max_rel_diff"] == 0.0
    assert trial["applied"] == f"anomaly detection kept off ({SCRIPT}:{_line_of('set_detect_anomaly(True)')})"
    assert f"{SCRIPT}:{_line_of('set_detect_anomaly(True)')}" in doc["best"]["changes"][0]["text"]


def test_a_trial_process_runs_without_the_debugging_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables are unset inside the trial process itself (no runner change): its probe no longer sees
    them, nor anomaly detection, while the baseline window does."""
    from pitstop.trials.request import FixRequest
    from pitstop.tune.window import run_window

    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    command = [sys.executable, str(SCRIPT), "--steps", "100000"]
    base = run_window(command, FixRequest(loss_steps=4), steps=6, warmup=2, timeout_s=300)
    fixed = run_window(
        command, FixRequest(fixes=frozenset({"debug_off"}), loss_steps=4), steps=6, warmup=2, timeout_s=300
    )
    assert base.diagnosis is not None and fixed.diagnosis is not None
    (before,), (after,) = base.diagnosis.profile.ranks, fixed.diagnosis.profile.ranks
    assert before.debug_modes is not None and after.debug_modes is not None
    assert before.debug_modes.settings == ["CUDA_LAUNCH_BLOCKING=1", "TORCH_DISTRIBUTED_DEBUG=DETAIL"]
    assert before.debug_modes.anomaly_steps == 6
    assert after.debug_modes.settings == [] and after.debug_modes.anomaly_steps == 0
    applied = fixed.applied["debug_off"]
    assert "CUDA_LAUNCH_BLOCKING unset" in applied and "TORCH_DISTRIBUTED_DEBUG unset" in applied
    assert len(base.losses) == 4 and fixed.losses == base.losses
