"""``pitstop doctor``: run under the probe, collect, diagnose, render."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pitstop.cli.errors import UserError
from pitstop.cli.live import Feed, LiveView, make_view
from pitstop.cli.money import resolve_price, resolve_total_steps, with_savings
from pitstop.cli.outputs import Outputs
from pitstop.diagnose import Diagnosis, diagnose
from pitstop.probe.stopping import WindowRule
from pitstop.report.live import small_window_steps
from pitstop.report.terminal import render
from pitstop.report.untrusted import markup
from pitstop.runner.inject import blind_spot
from pitstop.runner.measure import Measurement, StepWindow, measure
from pitstop.runner.relay import lines_before
from pitstop.wholerun.run import WholeRun
from pitstop.wholerun.windows import WindowSpec


def parse_window_steps(text: str) -> tuple[int, bool]:
    """``--steps``: a whole number of at least 1, or 'auto' (the window ends when it is precise enough)."""
    value = text.strip().lower()
    if value == "auto":
        return 50, True
    if not value.isdigit() or int(value) < 1:
        raise UserError(f"--steps: {text!r} is neither 'auto' nor a whole number of at least 1")
    return int(value), False


def measure_and_diagnose(
    command: list[str],
    steps: int | None,
    warmup: int,
    quiet: bool,
    label: str,
    timeout: float | None = None,
    rule: WindowRule | None = None,
    tty: bool | None = None,
) -> Diagnosis:
    """Run one command under the probe and diagnose it; a run with nothing to diagnose is a UserError."""
    console = Console(stderr=True)
    window = StepWindow(steps=steps, warmup=warmup, rule=rule)
    result = measure_live(command, window, quiet, timeout, tty)
    if result.profile is None:
        # a lost probe is pitstop's failure, said in one line: the job's own output does not explain it; nor
        # does it explain a run with nothing wrong (this node's ranks sent their measurements elsewhere)
        said = result.launch.probe_lost or result.exit_code == 0
        tail = [] if said else [line for line in result.log_tail if line.strip()][-15:]
        hint = "\n" + "\n".join("  | " + line for line in tail) if tail else ""
        raise UserError((result.message or "nothing measured") + hint, result.exit_code)
    if result.message:
        console.print(f"[yellow]pitstop: {markup(result.message)}[/yellow]", soft_wrap=True)
    diagnosis = diagnose(result.profile)
    diagnosis.profile.exit_code = result.exit_code
    return diagnosis


def measure_live(
    command: list[str], window: StepWindow, quiet: bool, timeout: float | None, tty: bool | None = None
) -> Measurement:
    """``measure`` with the watch's view: a panel on a terminal (the job's lines above it unless quiet),
    plain lines per small window elsewhere (the job's output then passes straight through)."""
    blind = blind_spot(command)
    if blind is not None:
        raise UserError(blind, 2)
    view = make_view(tty, command="doctor", overall="over the window")
    live = isinstance(view, LiveView)
    out = Path(tempfile.mkdtemp(prefix="pitstop-"))
    kept = Path(tempfile.mkdtemp(prefix="pitstop-doctor-"))  # the job's output, kept when some was held back
    log = kept / "job-output.log"
    whole = WholeRun(WindowSpec(steps=small_window_steps(window.steps)))
    feed = Feed(whole, view, [], out)
    if live and not quiet:
        feed.log = log  # the runner keeps the job's output there; the view prints it
    held = False
    try:
        result = measure(
            command,
            window,
            quiet=quiet or live,
            on_tick=feed.tick,
            timeout_s=timeout,
            out_dir=out,
            extra_env={"PYTHONUNBUFFERED": "1"} if live and not quiet else None,
            output_log=log,
        )
        feed.until = result.launch.output_cut  # the job's reaction to pitstop's stop stays in the log
        feed.tick(out)
        feed.publish(whole.finish()[0])
        held = _name_held_output(result, log)
        return result
    finally:
        view.close()
        shutil.rmtree(out, ignore_errors=True)
        if not held:
            shutil.rmtree(kept, ignore_errors=True)


def _name_held_output(result: Measurement, log: Path) -> bool:
    """Where the job's output after pitstop stopped it went (a note of the report, or the one line when there is
    no report). Returns whether the log is kept: only when pitstop stopped the job and held some back."""
    cut = result.launch.output_cut
    if cut is None or not log.exists():
        return False
    line = held_output_line(log, cut)
    if result.profile is not None:
        result.profile.notes.append(line)
    else:
        result.message = f"{result.message or 'nothing measured'} ({line})"
    return True


def held_output_line(log: Path, cut: int) -> str:
    """The note that names the log: the job's lines from the stop on are there, not on the terminal."""
    return f"the job's output after pitstop stopped it: {log} (from line {lines_before(log, cut) + 1})"


def run_doctor(
    command: list[str],
    steps: int,
    warmup: int,
    full: bool,
    quiet: bool,
    timeout: float | None,
    outputs: Outputs,
    auto: bool = False,
    price_per_gpu_hour: str | float | None = None,  # as typed: cli/money.py parses and refuses it
    total_steps: str | int | None = None,
) -> int:
    outputs.check()
    price = resolve_price(price_per_gpu_hour)  # a bad price or length is refused before the run starts
    total = resolve_total_steps(total_steps)
    quiet = (
        quiet or outputs.takes_stdout()
    )  # '-': standard output holds the document alone, not the job's lines
    rule = WindowRule() if auto and not full else None
    diagnosis = measure_and_diagnose(
        command, None if full else steps, warmup, quiet, "measuring", timeout, rule
    )
    diagnosis = _with_single_rank_reference(diagnosis, outputs)
    diagnosis = _with_previous_run(diagnosis, outputs)
    diagnosis = _with_calibration(diagnosis, outputs)
    with_savings(diagnosis, price, total)  # from the calibrated estimates
    doc = diagnosis.to_dict()
    outputs.write(doc)
    render(diagnosis, outputs.terminal())
    outputs.remember(doc, "doctor")
    return diagnosis.profile.exit_code or 0


def _with_calibration(diagnosis: Diagnosis, outputs: Outputs) -> Diagnosis:
    """Estimates scaled by what tune measured on jobs with this fingerprint in the history, if any (each
    corrected finding says so in its basis, and a note names the tune runs)."""
    if not outputs.record or not diagnosis.findings:
        return diagnosis
    import sqlite3

    from pitstop.history import HistoryError, fingerprint, open_store, resolve_path
    from pitstop.history.calibration import calibrations, corrected
    from pitstop.regular import regular_problem

    try:
        where = resolve_path(outputs.history)
        if not where.exists() or regular_problem(where) is not None:
            return diagnosis
        with open_store(where, create=False) as store:
            known = calibrations(store, fingerprint(diagnosis.to_dict()))
    except (HistoryError, OSError, RuntimeError, sqlite3.Error):
        return diagnosis  # the history is a help here, never a reason to lose the run
    if known:
        diagnosis.findings, notes = corrected(diagnosis.findings, known)
        diagnosis.notes.extend(notes)
    return diagnosis


def _with_previous_run(diagnosis: Diagnosis, outputs: Outputs) -> Diagnosis:
    """The newest run of the same workload in the history as the profile's baseline, diagnosed again with it:
    a run slower than it with other library versions is a library_upgrade finding (history/upgrade.py)."""
    if not outputs.record:
        return diagnosis
    from pitstop.history import HistoryError, resolve_path
    from pitstop.history.upgrade import previous_run
    from pitstop.regular import regular_problem

    try:
        where = resolve_path(outputs.history)
        if not where.exists() or regular_problem(where) is not None:
            return diagnosis
        found = previous_run(diagnosis.to_dict(), "doctor", where)
    except (HistoryError, OSError, RuntimeError):
        return diagnosis
    if found is None:
        return diagnosis
    profile = diagnosis.profile
    profile.baseline = found
    again = diagnose(profile)
    again.profile.exit_code = profile.exit_code
    return again


def _with_single_rank_reference(diagnosis: Diagnosis, outputs: Outputs) -> Diagnosis:
    """A multi-rank run's scaling efficiency against a comparable one-rank run from the history, if any."""
    if not outputs.record or diagnosis.profile.world_size < 2:
        return diagnosis
    from pitstop.history import resolve_path
    from pitstop.history.reference import single_rank_reference

    try:
        found = single_rank_reference(diagnosis.to_dict(), resolve_path(outputs.history))
    except (ValueError, OSError, RuntimeError):
        return diagnosis
    if found is None:
        return diagnosis
    profile = diagnosis.profile
    profile.single_rank_tokens_per_s, profile.single_rank_source = found
    again = diagnose(profile)
    again.profile.exit_code = profile.exit_code
    return again


def demo_command(fixed: bool) -> list[str]:
    return [sys.executable, "-m", "pitstop.demo.train"] + (["--fixed"] if fixed else [])


def run_demo(
    steps: int,
    warmup: int,
    fixed: bool,
    quiet: bool,
    outputs: Outputs,
) -> int:
    from pitstop.demo.prepare import ensure_demo_assets

    outputs.check()
    console = Console(stderr=True)
    with console.status("preparing the demo (tokenizer trained once, then cached)"):
        ensure_demo_assets()
    slow = measure_and_diagnose(demo_command(False), steps, warmup, quiet, "demo: naive fine-tune")
    doc = slow.to_dict()
    if not fixed:
        outputs.write(doc)
        render(slow, outputs.terminal())
        outputs.remember(doc, "demo")
        return 0
    fast = measure_and_diagnose(demo_command(True), steps, warmup, quiet, "demo: with the fixes")
    comparison = compare(slow, fast)
    outputs.write(doc | {"demo_comparison": comparison, "fixed": fast.to_dict()})
    render(slow, outputs.terminal())
    outputs.remember(doc, "demo")
    out = outputs.terminal()
    left = ", ".join(f"{f.cause} ({f.severity})" for f in fast.findings) or "no finding"
    out.print(
        f"[bold]With the fixes[/bold] (pre-tokenized, packed, SDPA; on a GPU also workers, bf16): {left}."
    )
    out.print(comparison_table(comparison))
    return 0


def compare(slow: Diagnosis, fast: Diagnosis) -> dict[str, float | None]:
    a, b = slow.metrics.real_tokens_per_s, fast.metrics.real_tokens_per_s
    return {
        "naive_real_tokens_per_s": a,
        "fixed_real_tokens_per_s": b,
        "speedup": None if not a or not b else b / a,
        "naive_step_time_s": slow.metrics.step_time_s,
        "fixed_step_time_s": fast.metrics.step_time_s,
    }


def comparison_table(c: dict[str, float | None]) -> Table:
    table = Table(title="Demo: naive vs fixed", title_justify="left")
    table.add_column("run")
    table.add_column("real tokens/s", justify="right")
    table.add_column("s/step", justify="right")

    def num(v: float | None, fmt: str) -> str:
        return "unknown" if v is None else format(v, fmt)

    table.add_row("naive", num(c["naive_real_tokens_per_s"], ",.0f"), num(c["naive_step_time_s"], ".3f"))
    table.add_row("fixed", num(c["fixed_real_tokens_per_s"], ",.0f"), num(c["fixed_step_time_s"], ".3f"))
    table.add_row("[bold]ratio[/bold]", f"[bold]×{num(c['speedup'], '.2f')}[/bold]", "")
    return table
