"""``pitstop watch``: run the job to its end under the probe, report changes as windows close, and a
whole-run report at the end (terminal, --json with a ``watch`` section, --html, trackers, history)."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from pitstop.cli.errors import UserError
from pitstop.cli.live import LiveView, View, make_view
from pitstop.cli.outputs import Outputs
from pitstop.diagnose import Diagnosis, diagnose
from pitstop.probe.config import ProbeConfig
from pitstop.report.terminal import render
from pitstop.report.trackers import Tracker, TrackerError, open_trackers, parse_report_to
from pitstop.runner.collect import collect
from pitstop.runner.follow import RankFollower
from pitstop.runner.launch import run_observed
from pitstop.wholerun.run import Event, WholeRun, WholeRunReport
from pitstop.wholerun.windows import WindowSpec


@dataclass
class WatchOptions:
    window_steps: int = 200
    window_seconds: float | None = None
    min_drop: float = 0.10
    warmup: int = 10
    report_to: str | None = None
    logdir: Path = Path("runs")
    series: Path | None = None  # keep the compressed per-step series here
    timeout: float | None = None
    tty: bool | None = None  # None: ask stderr


class _Feed:
    """Moves what the rank files say into the whole-run analysis, the view and the trackers."""

    def __init__(self, whole: WholeRun, view: View, trackers: list[Tracker], out: Path) -> None:
        self.whole, self.view, self.trackers = whole, view, trackers
        self.follower = RankFollower(out)
        self.log: Path | None = None
        self._log_offset = 0

    def tick(self, out: Path) -> None:
        self._job_output()
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            self.view.step(int(json.loads((out / "progress.json").read_text())["step"]))
        for news in self.follower.poll():
            if news.gpu:
                self.whole.add_gpu(news.rank, news.gpu)
            if news.steps or news.environment is not None:
                self.publish(self.whole.add(news.rank, news.steps, news.environment))

    def publish(self, events: list[Event]) -> None:
        self.view.events(events)
        for e in events:
            for t in self.trackers:
                t.log_window(e.window, e.changes)

    def _job_output(self) -> None:
        if self.log is None or not self.log.exists():
            return
        with self.log.open("rb") as f:
            f.seek(self._log_offset)
            chunk = f.read()
        cut = chunk.rfind(b"\n") + 1  # whole lines only
        if cut:
            self._log_offset += cut
            self.view.job_output(chunk[:cut].decode("utf-8", errors="replace"))


def run_watch(command: list[str], options: WatchOptions, outputs: Outputs) -> int:
    outputs.check()
    try:
        names = parse_report_to(options.report_to)
        spec = WindowSpec(options.window_steps, options.window_seconds)
    except (TrackerError, ValueError) as exc:
        raise UserError(str(exc)) from None
    out = Path(tempfile.mkdtemp(prefix="pitstop-watch-"))
    series = options.series or out / "series"
    whole = WholeRun(spec, options.min_drop, series)
    try:
        trackers = open_trackers(names, options.logdir)
    except TrackerError as exc:
        raise UserError(str(exc)) from None
    view = make_view(options.tty)
    live = isinstance(view, LiveView)
    feed = _Feed(whole, view, trackers, out)
    config = ProbeConfig(warmup=options.warmup, steps=None, stop_when_done=False, announce=not live)
    try:
        launch = run_observed(
            command,
            config,
            quiet=live,  # on a terminal the job's lines are printed above the panel, from its log
            on_tick=feed.tick,
            out_dir=out,
            timeout_s=options.timeout,
            extra_env={"PYTHONUNBUFFERED": "1"} if live else None,
        )
        feed.log = launch.log_path
        feed.tick(out)
        events, report = whole.finish()
        feed.publish(events)
    finally:
        view.close()
    try:
        diagnosis = _diagnosis(launch, options.warmup, out)
        for t in trackers:
            t.finish(report, diagnosis.findings)
        doc = diagnosis.to_dict() | {"watch": report.to_dict()}
        outputs.write(doc)
        render(diagnosis)
        print_report(report)
        outputs.remember(doc, "watch")
        return diagnosis.profile.exit_code or 0
    finally:
        if options.series is None:
            shutil.rmtree(out, ignore_errors=True)


def _diagnosis(launch: object, warmup: int, out: Path) -> Diagnosis:
    outcome = collect(launch, None, warmup, source="watch")  # type: ignore[arg-type]
    if outcome.profile is None:
        raise UserError(outcome.message or "nothing measured", outcome.exit_code)
    if outcome.message:
        Console(stderr=True).print(f"[yellow]pitstop: {outcome.message}[/yellow]", soft_wrap=True)
    diagnosis = diagnose(outcome.profile)
    diagnosis.profile.exit_code = outcome.exit_code
    return diagnosis


def print_report(report: WholeRunReport, console: Console | None = None) -> None:
    out = console or Console()
    out.rule("[bold]Whole run[/bold]", align="left")
    for line in report.lines():
        style = "yellow" if line.startswith(("change", "periodic")) else None
        out.print(line, style=style, soft_wrap=True, highlight=False)
