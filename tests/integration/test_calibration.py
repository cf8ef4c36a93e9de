"""The calibration harness on one small case (issue 27, item 1): a job padded to 256 tokens (examples of
16–120) is diagnosed by tune's first window and its padding fixes measured; the row holds the planted cause
ranked first, an estimate whose basis names its inputs, a measured speed-up and the estimate of before."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_the_padding_case_is_diagnosed_measured_and_tabled(tmp_path: Path) -> None:
    rows_path, docs = tmp_path / "rows.json", tmp_path / "docs"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "calibration.py"),
            "--cases",
            "padding-256",
            "--budget",
            "90",
            "--json",
            str(rows_path),
            "--keep",
            str(docs),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(rows_path.read_text())
    assert row["cause"] == "padding_waste" and row["found"] and row["rank"] == 1
    assert row["estimate"] and row["estimate"] > 1.0 and row["before"]
    assert row["measured_fix"] in ("trim_padding", "pack_batch")
    assert row["status"] in ("kept", "within noise", "slower", "undecided") and row["measured"] > 0
    doc = json.loads((docs / "padding-256.json").read_text())
    finding = next(f for f in doc["baseline_run"]["findings"] if f["cause"] == "padding_waste")
    assert "forward and backward take" in finding["speedup_basis"]  # the inputs of the estimate, named
    assert "| padding-256 | padding_waste | 1 |" in proc.stdout
    assert "median abs(log(est/measured))" in proc.stdout and "| padding_waste | 1 |" in proc.stdout
    bad = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "calibration.py"), "--cases", "nope"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "unknown case 'nope'" in bad.stderr
