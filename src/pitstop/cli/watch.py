"""``pitstop watch``: run the job to its end under the probe, report changes as windows close, and a
whole-run report at the end (terminal, --json with a ``watch`` section, --html, trackers, history)."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from pitstop.cli.doctor import held_output_line
from pitstop.cli.errors import UserError
from pitstop.cli.live import Feed, LiveView, make_view
from pitstop.cli.money import resolve_price, with_savings
from pitstop.cli.outputs import Outputs
from pitstop.core.vocabulary import Source
from pitstop.diagnose import Diagnosis, diagnose
from pitstop.probe.config import ProbeConfig
from pitstop.report.terminal import render
from pitstop.report.trackers import TrackerError, open_trackers, parse_report_to
from pitstop.report.untrusted import as_text, markup
from pitstop.runner.collect import collect
from pitstop.runner.launch import run_observed
from pitstop.wholerun.run import WholeRun, WholeRunReport
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


def run_watch(command: list[str], options: WatchOptions, outputs: Outputs) -> int:
    outputs.check()
    price = resolve_price(None)  # $PITSTOP_PRICE_PER_GPU_HOUR, refused before the run rather than after
    try:
        names = parse_report_to(options.report_to)
        spec = WindowSpec(options.window_steps, options.window_seconds)
    except (TrackerError, ValueError) as exc:
        raise UserError(str(exc)) from None
    out = Path(tempfile.mkdtemp(prefix="pitstop-watch-"))
    series = options.series or out / "series"
    whole = WholeRun(spec, options.min_drop, series, price=price)  # each window's cost at the price
    try:
        trackers = open_trackers(names, options.logdir)
    except TrackerError as exc:
        raise UserError(str(exc)) from None
    view = make_view(options.tty)
    live = isinstance(view, LiveView)
    feed = Feed(whole, view, trackers, out)
    config = ProbeConfig(warmup=options.warmup, steps=None, stop_when_done=False, announce=not live)
    # the job's whole output, kept when pitstop stopped the job (its --timeout) and held some of it back
    kept = Path(tempfile.mkdtemp(prefix="pitstop-watch-output-"))
    log = kept / "job-output.log"
    held = False
    quiet = live or outputs.takes_stdout()  # on a terminal the job's lines are printed above the panel
    try:
        launch = run_observed(
            command,
            config,
            quiet=quiet,
            on_tick=feed.tick,
            out_dir=out,
            timeout_s=options.timeout,
            extra_env={"PYTHONUNBUFFERED": "1"} if live else None,
            output_log=log,
        )
        if quiet:  # otherwise the relay showed the job's output as it came
            feed.log = launch.log_path
            feed.until = launch.output_cut  # the job's reaction to pitstop's stop (its --timeout) stays there
        feed.tick(out)
        events, report = whole.finish()
        feed.publish(events)
        held = launch.output_cut is not None and log.exists()
    finally:
        view.close()
        if not held:
            shutil.rmtree(kept, ignore_errors=True)
    try:
        diagnosis = _diagnosis(launch, options.warmup, out)
        if held and launch.output_cut is not None:
            diagnosis.profile.notes.append(held_output_line(log, launch.output_cut))
        with_savings(diagnosis, price, None)  # a run watched to its end has no steps left
        for t in trackers:
            t.finish(report, diagnosis.findings)
        doc = diagnosis.to_dict() | {"watch": report.to_dict()}
        outputs.write(doc)
        render(diagnosis, outputs.terminal())
        print_report(report, outputs.terminal())
        outputs.remember(doc, "watch")
        return diagnosis.profile.exit_code or 0
    finally:
        if options.series is None:
            shutil.rmtree(out, ignore_errors=True)


def _diagnosis(launch: object, warmup: int, out: Path) -> Diagnosis:
    outcome = collect(launch, None, warmup, source=Source.WATCH)  # type: ignore[arg-type]
    if outcome.profile is None:
        raise UserError(outcome.message or "nothing measured", outcome.exit_code)
    if outcome.message:
        Console(stderr=True).print(f"[yellow]pitstop: {markup(outcome.message)}[/yellow]", soft_wrap=True)
    diagnosis = diagnose(outcome.profile)
    diagnosis.profile.exit_code = outcome.exit_code
    return diagnosis


def print_report(report: WholeRunReport, console: Console | None = None) -> None:
    out = console or Console()
    out.rule("[bold]Whole run[/bold]", align="left")
    for line in report.lines():
        style = "yellow" if line.startswith(("change", "periodic")) else None
        out.print(as_text(line), style=style, soft_wrap=True, highlight=False)
