"""The whole-run numbers in real trackers, offline, read back: TensorBoard event files, a W&B offline run, an
MLflow file store; inside an already-open run (what the Trainer's report_to opened) no second run is made."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.trackers_read import tensorboard_events, wandb_history
from tests.unit.test_wholerun import series

from pitstop.core.findings import Finding
from pitstop.core.profile import Environment, RankProfile, RunProfile
from pitstop.diagnose import diagnose
from pitstop.report.trackers import (
    MlflowTracker,
    TensorBoardTracker,
    TrackerError,
    WandbTracker,
    parse_report_to,
)
from pitstop.wholerun.run import WholeRun, WholeRunReport
from pitstop.wholerun.windows import WindowSpec, WindowSummary


def watched() -> tuple[list[WindowSummary], WholeRunReport, list[Finding]]:
    run = WholeRun(WindowSpec(steps=100))
    records = series(500, slow_after=230)
    run.add(0, records, Environment(device="cpu"))
    _, report = run.finish()
    profile = RunProfile(
        source="watch", ranks=[RankProfile(steps=records, environment=Environment(device="cpu"))]
    )
    return report.windows, report, diagnose(profile).findings


def feed(
    tracker: object, windows: list[WindowSummary], report: WholeRunReport, findings: list[Finding]
) -> None:
    for w in windows:
        tracker.log_window(w, [c for c in report.changes if c.window == w.index])  # type: ignore[attr-defined]
    tracker.finish(report, findings)  # type: ignore[attr-defined]


def test_report_to_names() -> None:
    assert parse_report_to("tensorboard, wandb,mlflow,wandb") == ["tensorboard", "wandb", "mlflow"]
    with pytest.raises(TrackerError, match="unknown tracker 'comet'"):
        parse_report_to("comet")
    assert parse_report_to("trackio,tensorboard") == ["trackio", "tensorboard"]


def test_tensorboard_scalars_and_findings_text(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    windows, report, findings = watched()
    tracker = TensorBoardTracker(tmp_path)
    feed(tracker, windows, report, findings)
    acc = tensorboard_events(tracker.folder)
    tps = acc.Scalars("pitstop/tokens_per_s")
    assert [e.step for e in tps] == [w.last_step for w in windows]
    assert [e.value for e in tps] == pytest.approx([w.tokens_per_s for w in windows], rel=1e-6)
    waits = [e.value for e in acc.Scalars("pitstop/data_wait_frac")]
    assert waits[0] < 0.05 < 0.3 < waits[-1]  # the DataLoader slowed after step 230
    text = acc.Tensors("pitstop/findings")[-1].tensor_proto.string_val[0].decode()
    assert "dataloader_bound" in text and "step 2" in text  # the finding and the change's step
    changes = [t.tensor_proto.string_val[0].decode() for t in acc.Tensors("pitstop/changes")]
    assert any("tokens/s fell" in c for c in changes)


@pytest.mark.slow
def test_wandb_offline_run_holds_the_windows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    windows, report, findings = watched()
    tracker = WandbTracker("test-watch")
    run_dir = Path(tracker.run.dir).parent
    feed(tracker, windows, report, findings)
    assert wandb.run is None  # its own run: closed at the end
    rows = [r for r in wandb_history(run_dir) if "pitstop/tokens_per_s" in r]
    assert [r["pitstop/step"] for r in rows] == [w.last_step for w in windows]
    assert [r["pitstop/tokens_per_s"] for r in rows] == pytest.approx([w.tokens_per_s for w in windows])
    (table,) = (run_dir / "files" / "media" / "table" / "pitstop").glob("findings_*.table.json")
    assert "dataloader_bound" in table.read_text()


@pytest.mark.slow
def test_wandb_logs_into_the_run_already_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    windows, report, findings = watched()
    opened = wandb.init(project="trainer", dir=str(tmp_path))
    try:
        tracker = WandbTracker()
        assert tracker.run is opened and not tracker.own
        feed(tracker, windows, report, findings)
        assert wandb.run is opened  # left open for its owner
        opened.log({"train/loss": 1.0})
    finally:
        opened.finish()
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")  # one run, not two
    keys = {k for row in wandb_history(run_dir) for k in row}
    assert {"pitstop/tokens_per_s", "train/loss"} <= keys


@pytest.fixture
def file_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow >= 3.10 refuses its file store unless asked (it prefers a database; mlflow-skinny has none)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


@pytest.mark.slow
@pytest.mark.usefixtures("file_store")
def test_mlflow_file_store_inside_the_active_run(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(f"file:{tmp_path / 'mlruns'}")
    windows, report, findings = watched()
    with mlflow.start_run() as active:
        tracker = MlflowTracker()
        assert tracker.run_id == active.info.run_id and not tracker.own
        feed(tracker, windows, report, findings)
        assert mlflow.active_run() is not None  # not ended under its owner
    client = MlflowClient()
    history = client.get_metric_history(active.info.run_id, "pitstop/tokens_per_s")
    assert [m.step for m in history] == [w.last_step for w in windows]
    assert [m.value for m in history] == pytest.approx([w.tokens_per_s for w in windows])
    assert len(client.search_runs([active.info.experiment_id])) == 1
    text = Path(
        client.download_artifacts(active.info.run_id, "pitstop/findings.md", str(tmp_path))
    ).read_text()
    assert "dataloader_bound" in text


@pytest.mark.usefixtures("file_store")
@pytest.mark.slow  # mlflow runs git once per process to note the source's commit
def test_mlflow_own_run_is_ended(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(f"file:{tmp_path / 'mlruns'}")
    windows, report, findings = watched()
    tracker = MlflowTracker("own")
    feed(tracker, windows, report, findings)
    assert mlflow.active_run() is None
    run = MlflowClient().get_run(tracker.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["pitstop/data_wait_frac"] > 0.3  # the last window's, after the slowdown


@pytest.mark.slow  # mlflow runs git once per process to note the source's commit
def test_mlflow_refusing_its_store_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "false")
    mlflow.set_tracking_uri(f"file:{tmp_path / 'mlruns'}")
    with pytest.raises(TrackerError, match="mlflow cannot open a run"):
        MlflowTracker("refused")


TRACKIO_SCRIPT = """
import json, sys, trackio
from trackio.sqlite_storage import SQLiteStorage
from tests.unit.test_trackers import feed, watched
from pitstop.report.trackers import TrackioTracker

windows, report, findings = watched()
tracker = TrackioTracker(run_name="own")
feed(tracker, windows, report, findings)
outer = trackio.init(project="job", name="trainer", embed=False, auto_log_cpu=False, auto_log_gpu=False)
inside = TrackioTracker()  # the run the job opened (the Trainer's report_to): logged into, left open
feed(inside, windows, report, findings)
still_open = trackio.context_vars.current_run.get() is outer
trackio.finish()
out = {"runs": SQLiteStorage.get_runs("pitstop"), "own": SQLiteStorage.get_logs("pitstop", "own"),
       "job_runs": SQLiteStorage.get_runs("job"), "trainer": SQLiteStorage.get_logs("job", "trainer"),
       "own_closed": inside.own is False and tracker.own, "still_open": still_open,
       "last_steps": [w.last_step for w in windows], "causes": [f.cause for f in findings]}
print("RESULT" + json.dumps(out, default=str))
"""


@pytest.mark.slow
def test_trackio_local_store_holds_the_windows_and_findings(tmp_path: Path) -> None:
    pytest.importorskip("trackio")
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}  # read once, when trackio is imported
    proc = subprocess.run(
        [sys.executable, "-c", TRACKIO_SCRIPT], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert (tmp_path / "trackio" / "pitstop.db").exists()
    assert out["runs"] == ["own"] and out["job_runs"] == ["trainer"]  # no second run inside the job's
    assert out["own_closed"] and out["still_open"]
    for logs in (out["own"], out["trainer"]):
        rates = [row for row in logs if "pitstop/tokens_per_s" in row]
        assert [row["step"] for row in rates] == out["last_steps"]
        assert all(row["pitstop/tokens_per_s"] > 0 for row in rates)
        (last,) = [row for row in logs if "pitstop/findings" in row]
        table = last["pitstop/findings"]
        assert table["_type"] == "trackio.table"
        assert [r["cause"] for r in table["_value"]] == out["causes"]
        assert last["pitstop/changes"]["_value"][0]["kind"] == "slower"
        assert last["pitstop/findings_text"]["_type"] == "trackio.markdown"
        assert "**Changes**" in last["pitstop/findings_text"]["_value"]
