"""A watched run's numbers where users already look: TensorBoard, Weights & Biases, MLflow and trackio.

Per window: the window's scalars (tokens/s, real tokens/s, MFU, data-wait share, padding share, GPU
utilization, synchronisation share, step time; and, where measured, GPU power, joules per step and per real
token, and with a price per GPU-hour the cost per million real tokens) under ``pitstop/``, at the window's last optimizer step (the
Trainer's ``global_step``). At the end: the findings and changes as a table / text, and headline figures in
the run's summary.

Which run: when a run is already open in this process (``wandb.run``, ``mlflow.active_run()``, trackio's current
run: the Trainer's own ``report_to`` opened it), pitstop logs into it and never closes it; otherwise it opens one
of its own, honours the library's own settings (WANDB_MODE, WANDB_DIR, MLFLOW_TRACKING_URI, TRACKIO_DIR) and
closes it at the end.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from pitstop.core.findings import Finding
from pitstop.errors import PitstopError
from pitstop.report.savings import describe
from pitstop.wholerun.changes import Change
from pitstop.wholerun.run import WholeRunReport
from pitstop.wholerun.windows import WindowSummary

PREFIX = "pitstop/"
KNOWN = ("tensorboard", "wandb", "mlflow", "trackio")


class TrackerError(PitstopError):
    """A requested tracker cannot be used (not installed, or an unknown name)."""


class Tracker(Protocol):
    name: str

    def log_window(self, window: WindowSummary, changes: list[Change]) -> None: ...

    def finish(self, report: WholeRunReport, findings: list[Finding]) -> None: ...


def _scalars(window: WindowSummary) -> dict[str, float]:
    return {PREFIX + k: v for k, v in window.scalars().items()}


def findings_rows(findings: list[Finding]) -> list[list[Any]]:
    """One row per finding; the saving's columns are empty where the run's length was unknown."""
    rows = []
    for f in findings:
        s = f.saving
        saved = [None, None, None] if s is None else [round(s.seconds, 1), round(s.gpu_hours, 4), s.money]
        rows.append(
            [f.cause, str(f.severity), round(f.confidence, 2), f.est_speedup, *saved, f.summary, f.fix.text]
        )
    return rows


FINDING_COLUMNS = [
    "cause",
    "severity",
    "confidence",
    "est_speedup",
    "saved_s",  # wall time the fix would save over the rest of the run (diagnose/savings.py)
    "saved_gpu_hours",
    "saved_money",  # at the price per GPU-hour, where one was given
    "summary",
    "fix",
]
CHANGE_COLUMNS = ["step", "kind", "cause", "text"]


def findings_markdown(report: WholeRunReport, findings: list[Finding]) -> str:
    """The findings, changes and periodic stalls as one markdown text (what a text panel shows)."""
    lines = ["| cause | severity | est. speed-up | saves | summary |", "|---|---|---|---|---|"]
    for f in findings:
        speed = "?" if f.est_speedup is None else f"×{f.est_speedup:.2f}"
        saves = "" if f.saving is None else describe(f.saving)
        lines.append(f"| {f.cause} | {f.severity} | {speed} | {saves} | {f.summary.replace('|', '/')} |")
    if not findings:
        lines.append("| none | | | | |")
    lines += ["", "**Changes**", ""]
    lines += [f"- step {c.step:,} ({c.kind}): {c.text}" for c in report.changes] or ["- none"]
    lines += ["", "**Periodic stalls**", ""]
    lines += [f"- {s.describe()}" for s in report.stalls] or ["- none"]
    return "\n".join(lines)


def _stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")


class TensorBoardTracker:
    """Event files in a new run folder under ``logdir`` (TensorBoard's own writer, no torch needed)."""

    name = "tensorboard"

    def __init__(self, logdir: Path, run_name: str | None = None, same_folder: bool = False) -> None:
        from pitstop.report.errors import ReportError
        from pitstop.report.tensorboard import _EventSink, _new_run_folder, _writer_api

        try:
            api = _writer_api()
        except ReportError as exc:
            raise TrackerError(str(exc)) from None
        self._event_pb2 = api[1]
        if same_folder:  # beside the job's own event files: one run in TensorBoard
            logdir.mkdir(parents=True, exist_ok=True)
            self.folder = logdir
        else:
            self.folder = _new_run_folder(logdir, run_name or f"pitstop-watch-{_stamp()}")
        self._sink = _EventSink(api, self.folder)
        self._last_step = 0

    def log_window(self, window: WindowSummary, changes: list[Change]) -> None:
        self._last_step = window.last_step
        self._sink.add(window.last_step, time.time(), _scalars(window))
        for c in changes:
            self._text("pitstop/changes", f"step {c.step:,} ({c.kind}): {c.text}", window.last_step)

    def _text(self, tag: str, text: str, step: int) -> None:
        from tensorboard.plugins.text.summary_v2 import text_pb

        event = self._event_pb2.Event(wall_time=time.time(), step=step, summary=text_pb(tag, text))
        self._sink._writer.add_event(event)

    def finish(self, report: WholeRunReport, findings: list[Finding]) -> None:
        self._text("pitstop/findings", findings_markdown(report, findings), self._last_step)
        self._sink.close()


class WandbTracker:
    name = "wandb"

    def __init__(self, run_name: str | None = None) -> None:
        try:
            import wandb
        except ImportError:
            raise TrackerError("--report-to wandb needs wandb: pip install 'pitstop[track]'") from None
        self._wandb = wandb
        self.own = wandb.run is None
        self.run = wandb.run or wandb.init(project="pitstop", name=run_name or f"pitstop-watch-{_stamp()}")
        self.run.define_metric(PREFIX + "step")
        self.run.define_metric(PREFIX + "*", step_metric=PREFIX + "step")

    def log_window(self, window: WindowSummary, changes: list[Change]) -> None:
        self.run.log({**_scalars(window), PREFIX + "step": window.last_step})

    def finish(self, report: WholeRunReport, findings: list[Finding]) -> None:
        wandb = self._wandb
        tables = {
            PREFIX + "findings": wandb.Table(columns=FINDING_COLUMNS, data=findings_rows(findings)),
            PREFIX + "changes": wandb.Table(
                columns=CHANGE_COLUMNS, data=[[c.step, c.kind, c.cause, c.text] for c in report.changes]
            ),
        }
        self.run.log(tables)
        self.run.summary[PREFIX + "findings_text"] = findings_markdown(report, findings)
        self.run.summary[PREFIX + "top_finding"] = findings[0].cause if findings else "none"
        self.run.summary[PREFIX + "changes"] = len(report.changes)
        if self.own:
            self.run.finish()


class MlflowTracker:
    name = "mlflow"

    def __init__(self, run_name: str | None = None) -> None:
        try:
            import mlflow
        except ImportError:
            raise TrackerError("--report-to mlflow needs mlflow: pip install 'pitstop[track]'") from None
        self._mlflow = mlflow
        active = mlflow.active_run()
        self.own = active is None
        try:
            self.run = active or mlflow.start_run(run_name=run_name or f"pitstop-watch-{_stamp()}")
        except mlflow.exceptions.MlflowException as exc:
            first = str(exc).split(". ")[0]
            raise TrackerError(
                f"mlflow cannot open a run at {mlflow.get_tracking_uri()}: {first} (a file store needs "
                "MLFLOW_ALLOW_FILE_STORE=true with MLflow >= 3.10; or set MLFLOW_TRACKING_URI)"
            ) from None
        self.run_id = self.run.info.run_id

    def log_window(self, window: WindowSummary, changes: list[Change]) -> None:
        from mlflow.tracking import MlflowClient

        client = MlflowClient()
        stamp = int(time.time() * 1000)
        from mlflow.entities import Metric

        metrics = [Metric(k, v, stamp, window.last_step) for k, v in _scalars(window).items()]
        client.log_batch(self.run_id, metrics=metrics)  # by run id: safe from any thread

    def finish(self, report: WholeRunReport, findings: list[Finding]) -> None:
        from mlflow.tracking import MlflowClient

        client = MlflowClient()
        client.log_text(self.run_id, findings_markdown(report, findings), "pitstop/findings.md")
        table = {
            "findings": [dict(zip(FINDING_COLUMNS, row, strict=True)) for row in findings_rows(findings)],
            "changes": [c.to_dict() for c in report.changes],
            "periodic_stalls": [s.to_dict() for s in report.stalls],
        }
        client.log_text(self.run_id, json.dumps(table, indent=1, default=str), "pitstop/findings.json")
        if self.own:
            client.set_terminated(self.run_id)
            still = self._mlflow.active_run()
            if still is not None and still.info.run_id == self.run_id:
                self._mlflow.end_run()


class TrackioTracker:
    """trackio's local store (SQLite under TRACKIO_DIR, ~/.cache/huggingface/trackio by default; no server
    needed to log): per window the scalars, at the end the findings and changes as tables and as markdown."""

    name = "trackio"

    def __init__(self, run_name: str | None = None) -> None:
        try:
            import trackio
            from trackio import context_vars
        except ImportError:
            raise TrackerError("--report-to trackio needs trackio: pip install 'pitstop[track]'") from None
        self._trackio = trackio
        active = context_vars.current_run.get()
        self.own = active is None
        self.run = active or trackio.init(
            project="pitstop",
            name=run_name or f"pitstop-watch-{_stamp()}",
            embed=False,
            auto_log_cpu=False,  # pitstop's own run holds pitstop's numbers only
            auto_log_gpu=False,
        )
        self._last_step = 0

    def log_window(self, window: WindowSummary, changes: list[Change]) -> None:
        self._last_step = window.last_step
        self.run.log(_scalars(window), step=window.last_step)

    def finish(self, report: WholeRunReport, findings: list[Finding]) -> None:
        trackio = self._trackio
        changes = [[c.step, c.kind, c.cause, c.text] for c in report.changes]
        self.run.log(
            {
                PREFIX + "findings": trackio.Table(columns=FINDING_COLUMNS, data=findings_rows(findings)),
                PREFIX + "changes": trackio.Table(columns=CHANGE_COLUMNS, data=changes),
                PREFIX + "findings_text": trackio.Markdown(findings_markdown(report, findings)),
            },
            step=self._last_step,
        )
        if self.own:
            self.run.finish()
            from trackio import context_vars

            if context_vars.current_run.get() is self.run:
                context_vars.current_run.set(None)


class AccelerateTracker:
    """The trackers an Accelerate job opened with ``accelerator.init_trackers``: pitstop logs through
    ``accelerator.log`` (main process only, every tracker of the job), so its numbers sit in the job's own runs.
    Accelerate logs scalars and strings, so the findings go as one markdown text (TensorBoard's text panel)."""

    name = "accelerate"

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator
        self._last_step = 0

    def log_window(self, window: WindowSummary, changes: list[Change]) -> None:
        self._last_step = window.last_step
        self.accelerator.log(_scalars(window), step=window.last_step)
        for c in changes:
            text = f"step {c.step:,} ({c.kind}): {c.text}"
            self.accelerator.log({PREFIX + "changes": text}, step=window.last_step)

    def finish(self, report: WholeRunReport, findings: list[Finding]) -> None:
        text = findings_markdown(report, findings)
        self.accelerator.log({PREFIX + "findings": text}, step=self._last_step)  # the job ends its runs


def parse_report_to(value: str | None) -> list[str]:
    """``tensorboard,wandb`` -> names; an unknown name is a one-line error."""
    if not value:
        return []
    names = [n.strip().lower() for n in value.split(",") if n.strip()]
    for n in names:
        if n not in KNOWN:
            raise TrackerError(f"unknown tracker {n!r} in --report-to; known: {', '.join(KNOWN)}")
    return list(dict.fromkeys(names))


def open_trackers(
    names: list[str], logdir: Path, run_name: str | None = None, same_folder: bool = False
) -> list[Tracker]:
    out: list[Tracker] = []
    for n in names:
        if n == "tensorboard":
            out.append(TensorBoardTracker(logdir, run_name, same_folder))
        elif n == "wandb":
            out.append(WandbTracker(run_name))
        elif n == "mlflow":
            out.append(MlflowTracker(run_name))
        elif n == "trackio":
            out.append(TrackioTracker(run_name))
    return out
