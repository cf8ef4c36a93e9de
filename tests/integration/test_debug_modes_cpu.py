"""debug_modes planted in a real tiny training under `pitstop doctor`: autograd's anomaly detection switched
on once before the loop, or entered around every step. pitstop names the mode and the job's own line, puts a
cost on it, and the job computes the same losses as without pitstop; the same loop without it is not flagged.
The asserts are on which cause and what evidence, not on a share (anomaly detection roughly doubles this
step on a CPU, far from the finding's threshold, which counts steps, not time)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, causes, doctor

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
