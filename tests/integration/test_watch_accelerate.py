"""``pitstop.watch(mode="watch")`` inside a real Accelerate loop on CPU that called ``init_trackers`` with
TensorBoard: pitstop's windows go through ``accelerator.log`` into the job's own run (one event-file folder,
beside the job's own ``loss``), and no second run is opened."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, SCRIPTS
from tests.trackers_read import tensorboard_events

pytestmark = pytest.mark.slow


@pytest.mark.smoke
def test_the_windows_land_in_the_accelerators_tensorboard_run(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    pytest.importorskip("tensorboard")
    script = [sys.executable, str(SCRIPTS / "accelerate_watch.py"), "--project-dir", str(tmp_path)]
    proc = subprocess.run([*script, "--steps", "40"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "windows=4" in proc.stdout  # steps 3–40 after 2 warm-up steps, windows of 10
    folders = {p.parent for p in tmp_path.rglob("events.out.tfevents.*")}
    assert folders == {tmp_path / "job"}  # the job's run only: pitstop opened none of its own
    acc = tensorboard_events(tmp_path / "job")
    assert "loss" in acc.Tags()["scalars"]  # the job's own scalars, in the same run
    steps = [e.step for e in acc.Scalars("pitstop/tokens_per_s")]
    assert steps == [12, 22, 32, 40] and all(e.value > 0 for e in acc.Scalars("pitstop/tokens_per_s"))
    assert "pitstop/data_wait_frac" in acc.Tags()["scalars"]
    (text,) = acc.Tensors("pitstop/findings/text_summary")
    assert b"Periodic stalls" in text.tensor_proto.string_val[0]
