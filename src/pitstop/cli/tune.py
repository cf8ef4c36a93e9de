"""``pitstop tune``: run the tune loop with progress on stderr, then the table and the changes to make."""

from __future__ import annotations

import re
import time

from rich.console import Console
from rich.progress import TaskID
from rich.syntax import Syntax
from rich.table import Table

from pitstop.cli.errors import UserError
from pitstop.cli.outputs import Outputs
from pitstop.cli.progress import steps_bar
from pitstop.report.untrusted import markup
from pitstop.tune.conclusion import no_gain_verdict
from pitstop.tune.proposals import tunable, unknown_fixes
from pitstop.tune.session import TuneError, TuneOptions, TuneResult, tune
from pitstop.tune.verdict import LOSSES_UNDECIDED, SINGLE_POINT
from pitstop.tune.window import Window


def parse_budget(text: str) -> float:
    """'10m', '90s', '1h', '600' → seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise UserError(f"--budget: {text!r} is not a duration (e.g. 10m, 90s, 1h)")
    value = float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
    if value < 30:
        raise UserError("--budget: at least 30s (a baseline window alone takes longer)")
    return value


def parse_steps(text: str) -> int | None:
    """'auto' (None: windows end by precision) or a whole number of at least 2."""
    if text.strip().lower() == "auto":
        return None
    if not text.strip().isdigit() or int(text) < 2:
        raise UserError(f"--steps: {text!r} is neither 'auto' nor a whole number of at least 2")
    return int(text)


def parse_fixes(option: str, values: list[str]) -> list[str]:
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    bad = unknown_fixes(names)
    if bad:
        raise UserError(f"{option}: unknown fix {bad[0]!r}; known: {', '.join(tunable())}")
    return names


HEARTBEAT_S = 10.0  # the longest tune stays silent while a window runs, where no live bar shows


class RichProgress:
    """A line per phase ("measuring the baseline (1 of 2) ...", "trying pack_batch (cause padding_waste)
    ..."), with the seconds since tune started, each on its own line (the job's own output goes to a log file,
    never here); a bar per window in a terminal, and a line every ``HEARTBEAT_S`` seconds elsewhere."""

    def __init__(self, console: Console, total_steps: int | None) -> None:
        self.console = console
        self.total_steps = total_steps
        self.bar = steps_bar(console)
        self.task: TaskID | None = None
        self.started = time.monotonic()
        self.window_started = self.started
        self.last_line = self.started
        self.label = ""
        self.latest_step = 0

    def __enter__(self) -> RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def line(self, text: str) -> None:
        """One line of pitstop's own, with the seconds since tune started."""
        self.last_line = time.monotonic()
        elapsed = self.last_line - self.started
        self.console.print(f"  [dim]\\[{elapsed:4.0f} s][/dim] {text}", soft_wrap=True)

    def window(self, label: str, index: int, total: int) -> None:
        if self.task is not None:
            self.bar.remove_task(self.task)
        self.label, self.latest_step = label, 0
        self.window_started = time.monotonic()
        self.line(f"{markup(label)} ...")
        self.task = self.bar.add_task(f"window {index}/{total}: {markup(label)}", total=self.total_steps)

    def step(self, step: int) -> None:
        self.latest_step = step
        if self.task is not None:
            self.bar.update(self.task, completed=min(step, self.total_steps) if self.total_steps else step)

    def waiting(self) -> None:
        """Called while a window runs: where no live bar shows, say what is going on every few seconds."""
        if self.console.is_terminal or time.monotonic() - self.last_line < HEARTBEAT_S:
            return
        into = time.monotonic() - self.window_started
        where = f"step {self.latest_step}" if self.latest_step else "the job is starting"
        self.line(f"  ... still {markup(self.label)}: {into:.0f} s in, {where}")

    def note(self, text: str) -> None:
        """The budget plan, said once the first window has shown the job's pace."""
        self.last_line = time.monotonic()
        self.console.print(f"  [bold]plan:[/bold] {markup(text)}", soft_wrap=True)

    def done(self, label: str, window: Window) -> None:
        if window.ok:
            spread = f" ±{window.spread:.1%}" if window.spread is not None else ""
            text = f"{window.real_tokens_per_s:,.0f} real tokens/s{spread} ({window.seconds:.0f} s)"
        else:
            text = f"[red]{markup(window.error or '')}[/red]"
        self.line(f"{markup(label)}: {text}")


def _num(v: float | None, fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def result_table(result: TuneResult) -> Table:
    b = result.baseline
    table = Table(title="pitstop tune: measured on your job", title_justify="left")
    for name, justify in (
        ("fix", "left"),
        ("computation", "left"),
        ("real tokens/s", "right"),
        ("speed-up", "right"),
        ("verdict", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    repeats = f"measured {b.windows}×" if b.windows > 1 else "measured once"
    drift = f"{repeats}, drift {b.drift:+.1%}" if b.drift is not None else repeats
    table.add_row("baseline", "", f"{b.real_tokens_per_s:,.0f}", f"±{b.spread:.1%}", drift)
    for v in result.verdicts:
        speed = "–" if v.speedup is None else f"×{v.speedup:.2f} ±{(v.spread or 0):.0%}"
        if v.speedup is not None and v.gain_basis == SINGLE_POINT:
            speed += " (1 baseline)"
        verdict = "[green]kept[/green]" if v.kept else f"[red]{v.status}[/red]"
        table.add_row(
            v.fix,
            "preserved" if v.preserves_computation else "changed",
            _num(v.real_tokens_per_s, ",.0f"),
            speed,
            verdict,
        )
    for fix, _why in result.not_tried:
        table.add_row(fix, "", "–", "–", "not tried")
    together = result.combined
    if together is not None:
        speed = "–" if together.speedup is None else f"×{together.speedup:.2f} ±{(together.spread or 0):.0%}"
        table.add_row(
            "[bold]" + " + ".join(together.fixes) + "[/bold]",
            "",
            _num(together.real_tokens_per_s, ",.0f"),
            f"[bold]{speed}[/bold]",
            "together: [green]kept[/green]" if together.kept else f"together: {together.status}",
        )
    return table


def render(result: TuneResult, console: Console | None = None) -> None:
    out = console or Console()
    out.print(result_table(result))
    for v in result.verdicts:
        if not v.kept and (v.speedup is None or v.status == LOSSES_UNDECIDED):
            out.print(f"  [dim]{v.fix}: {v.status}: {markup(v.reason)}[/dim]", soft_wrap=True)
    for fix, why in result.not_tried:
        out.print(f"  [dim]{fix}: not tried: {markup(why)}[/dim]", soft_wrap=True)
    for note in result.notes:
        out.print(f"[yellow]note:[/yellow] {markup(note)}", soft_wrap=True)
    best = result.best
    if best is None:
        out.print(no_gain_verdict(result), soft_wrap=True)
        return
    out.print(
        f"\n[bold]Keep: {', '.join(best.fixes)}[/bold] — ×{best.speedup:.2f} "
        f"({result.baseline.real_tokens_per_s:,.0f} → {best.real_tokens_per_s:,.0f} real tokens/s). "
        "The changes, in your framework:",
        soft_wrap=True,
    )
    for change in best.changes:
        out.print(f"\n[bold]{change.fix}[/bold]: {markup(change.text)}", soft_wrap=True)
        out.print(
            Syntax(change.snippet, "python", theme="ansi_dark", background_color="default", word_wrap=True)
        )
    if result.redirected:
        out.print(
            f"\n[dim]During trials the job's files went to a scratch folder (removed): {markup(result.redirected[0])}[/dim]"
        )


def window_words(options: TuneOptions) -> str:
    if options.steps is None:
        return "each window as long as its precision needs"
    return f"windows of {options.warmup} + {options.steps} optimizer steps"


def run_tune(command: list[str], options: TuneOptions, outputs: Outputs) -> TuneResult:
    outputs.check()
    console = Console(stderr=True)
    console.print(
        f"pitstop tune: {markup(' '.join(command), one_line=True)}\n"
        f"  {window_words(options)}, budget {options.budget_s / 60:.0f} min",
        soft_wrap=True,
    )
    try:
        total = None if options.steps is None else options.warmup + options.steps
        with RichProgress(console, total) as progress:
            result = tune(command, options, progress)
    except TuneError as exc:
        raise UserError(str(exc), 1) from None
    doc = result.to_dict()
    outputs.write(doc)
    render(result, outputs.terminal())
    outputs.remember(doc, "tune")
    return result
