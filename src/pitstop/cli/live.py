"""What ``pitstop watch`` and ``pitstop doctor`` show while the job runs: one compact rich panel updated in
place on a terminal, plain append-only lines elsewhere (CI logs, Slurm files), so a log keeps every window and
every change. Both commands feed the view the same way (``Feed``): the rank files' new steps go through a
``WholeRun`` and each closed window is shown."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from pitstop.runner.follow import RankFollower
from pitstop.wholerun.changes import Change
from pitstop.wholerun.run import Event, WholeRun
from pitstop.wholerun.windows import WindowSummary

if TYPE_CHECKING:
    from pitstop.report.trackers import Tracker

PREFIX = "pitstop watch:"


def prefix(command: str) -> str:
    return f"pitstop {command}:"


def _pct(v: float | None) -> str:
    return "?" if v is None else f"{v:.0%}"


def _rate(v: float | None) -> str:
    return "?" if v is None else f"{v:,.0f}"


def window_line(w: WindowSummary, command: str = "watch") -> str:
    """One window in one line: what the log keeps."""
    parts = [
        f"steps {w.first_step:,}–{w.last_step:,}",
        f"{_rate(w.tokens_per_s)} tokens/s",
        f"real {_rate(w.real_tokens_per_s)}/s",
        f"data wait {_pct(w.data_wait_frac)}",
    ]
    if w.gpu_util is not None:
        parts.append(f"GPU {_pct(w.gpu_util)}")
    if w.mfu is not None:
        parts.append(f"MFU {_pct(w.mfu)}")
    top = w.findings[0].cause if w.findings else "no finding"
    return f"{prefix(command)} " + ", ".join(parts) + f"; top: {top}"


def change_line(c: Change, command: str = "watch") -> str:
    return f"{prefix(command)} CHANGE ({c.kind}) {c.text}"


class View(Protocol):
    def step(self, n: int) -> None: ...
    def events(self, events: list[Event]) -> None: ...
    def job_output(self, text: str) -> None: ...
    def close(self) -> None: ...


class PlainView:
    """Append-only lines on a stream that is not a terminal."""

    def __init__(self, stream: IO[str] | None = None, command: str = "watch") -> None:
        self.stream = stream or sys.stderr
        self.command = command

    def step(self, n: int) -> None:
        return None

    def events(self, events: list[Event]) -> None:
        for e in events:
            print(window_line(e.window, self.command), file=self.stream, flush=True)
            for c in e.changes:
                print(change_line(c, self.command), file=self.stream, flush=True)

    def job_output(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def close(self) -> None:
        return None


class LiveView:
    """A rich panel below the job's output, redrawn in place; the job's lines and each change are printed above
    it, so nothing scrolls away under the panel."""

    def __init__(
        self, console: Console | None = None, command: str = "watch", overall: str = "over the run"
    ) -> None:
        self.console = console or Console(stderr=True)
        self.command, self.overall = command, overall
        self.last_step = 0
        self.now: WindowSummary | None = None
        self._tokens = 0.0  # tokens/s × seconds summed over windows (the run's rate without keeping windows)
        self._seconds = 0.0
        self._rated = True
        self.latest_change: Change | None = None
        self.live = Live(self._panel(), console=self.console, refresh_per_second=2, transient=False)
        self.live.start()

    def _panel(self) -> Panel:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="dim")
        grid.add_column()
        now = self.now
        overall = self._tokens / self._seconds if self._rated and self._seconds else None
        grid.add_row("step", f"{self.last_step:,}")
        if now is None:
            grid.add_row("tokens/s", "first window not closed yet")
        else:
            real = None if now.padding_frac is None else 1.0 - now.padding_frac
            grid.add_row("tokens/s", f"{_rate(now.tokens_per_s)} now · {_rate(overall)} {self.overall}")
            grid.add_row("real tokens", f"{_pct(real)} of tokens · data wait {_pct(now.data_wait_frac)}")
            if now.gpu_util is not None or now.mfu is not None:
                grid.add_row("GPU", f"utilization {_pct(now.gpu_util)} · MFU {_pct(now.mfu)}")
            top = now.findings[0] if now.findings else None
            grid.add_row("top finding", "none" if top is None else f"{top.cause} ({top.severity})")
        if self.latest_change is not None:
            grid.add_row("last change", Text(self.latest_change.text, style="yellow"))
        return Panel(grid, title=f"pitstop {self.command}", title_align="left", expand=False)

    def step(self, n: int) -> None:
        if n != self.last_step:
            self.last_step = n
            self.live.update(self._panel())

    def events(self, events: list[Event]) -> None:
        for e in events:
            self.now = e.window
            self._seconds += e.window.seconds
            if e.window.tokens_per_s is None:
                self._rated = False
            else:
                self._tokens += e.window.tokens_per_s * e.window.seconds
            self.last_step = max(self.last_step, e.window.last_step)
            for c in e.changes:
                self.latest_change = c
                self.live.console.print(Text(change_line(c, self.command), style="yellow"))
        self.live.update(self._panel())

    def job_output(self, text: str) -> None:
        self.live.console.out(text.rstrip("\n"), highlight=False)

    def close(self) -> None:
        self.live.update(Group(self._panel()))
        self.live.stop()


def make_view(tty: bool | None = None, command: str = "watch", overall: str = "over the run") -> View:
    """The panel on a terminal, plain lines elsewhere."""
    is_tty = sys.stderr.isatty() if tty is None else tty
    return LiveView(command=command, overall=overall) if is_tty else PlainView(command=command)


class Feed:
    """Moves what the rank files say into the whole-run analysis, the view and the trackers; shared by
    ``watch`` (the whole run) and ``doctor`` (its short window, cut into small windows)."""

    def __init__(self, whole: WholeRun, view: View, trackers: list[Tracker], out: Path) -> None:
        self.whole, self.view, self.trackers = whole, view, trackers
        self.follower = RankFollower(out)
        self.log: Path | None = None  # the job's output, when it runs quietly and the view shows it
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
