"""``PitstopCallback(mode="watch")`` inside a real HF Trainer whose own ``report_to`` is TensorBoard, W&B
(offline) and MLflow (a file store): pitstop's per-window numbers and its change land in the runs the Trainer
opened, one run each, read back from disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS
from tests.trackers_read import tensorboard_events, wandb_history

pytestmark = pytest.mark.slow


def test_the_callback_logs_into_the_trainers_own_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("wandb")
    mlflow = pytest.importorskip("mlflow")
    env = {
        **os.environ,
        "TENSORBOARD_LOGGING_DIR": str(tmp_path / "tb"),
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(tmp_path),
        "MLFLOW_TRACKING_URI": f"file:{tmp_path / 'mlruns'}",
        "MLFLOW_ALLOW_FILE_STORE": "true",
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable, str(SCRIPTS / "hf_trainer.py"), "--steps", "100", "--batch", "4", "--packed",
        "--callback", str(tmp_path / "run.json"), "--watch-window", "20", "--report-to", "tensorboard,wandb,mlflow",
        "--logging-steps", "10", "--slow-after", "50",
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CHANGE (slower) from step 5" in proc.stderr  # printed by rank 0 when the window confirmed it

    windows_end = [23, 43, 63, 83, 100]  # 3 warm-up steps, then windows of 20, the last one shorter
    acc = tensorboard_events(tmp_path / "tb")  # the Trainer's own folder: one TensorBoard run
    assert {"train/loss", "pitstop/tokens_per_s"} <= set(acc.Tags()["scalars"])
    waits = acc.Scalars("pitstop/data_wait_frac")
    assert [e.step for e in waits] == windows_end
    assert waits[1].value < 0.2 < 0.3 < waits[3].value  # 4 × 40 ms of reads a step from step 51
    (change,) = [t.tensor_proto.string_val[0].decode() for t in acc.Tensors("pitstop/changes")][:1]
    assert "(slower)" in change and "data wait" in change

    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")  # the Trainer's W&B run, not a second one
    rows = wandb_history(run_dir)
    steps = [r["pitstop/step"] for r in rows if "pitstop/tokens_per_s" in r]
    assert steps == windows_end
    assert any("train/loss" in r for r in rows)

    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient()
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert len(runs) == 1  # the Trainer's MLflow run
    history = client.get_metric_history(runs[0].info.run_id, "pitstop/data_wait_frac")
    assert [m.step for m in history] == windows_end
    assert "loss" in runs[0].data.metrics
