"""What ``pitstop watch``, ``pitstop doctor`` and ``pitstop.watch()`` show while the job runs: one compact
panel updated in place (rich on a terminal; in a Jupyter kernel the same panel as HTML in a display handle,
since a notebook does not interpret cursor escapes), plain append-only lines elsewhere (CI logs, Slurm files),
so a log keeps every window and every change."""

from __future__ import annotations

import io
import sys
from typing import IO, Any, Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from pitstop.report.untrusted import as_text, shown
from pitstop.wholerun.changes import Change
from pitstop.wholerun.run import Event
from pitstop.wholerun.windows import WindowSummary

SMALL_WINDOWS = 5  # a short measured window is shown as this many small windows (tokens/s "now")

PREFIX = "pitstop watch:"


def prefix(command: str) -> str:
    return f"pitstop {command}:"


def _pct(v: float | None) -> str:
    return "?" if v is None else f"{v:.0%}"


def _rate(v: float | None) -> str:
    return "?" if v is None else f"{v:,.0f}"


def small_window_steps(steps: int | None) -> int:
    """Small windows for a short measurement's live view: a fifth of it (10 steps when its length is open)."""
    return max(4, (steps or 10 * SMALL_WINDOWS) // SMALL_WINDOWS)


def in_kernel() -> bool:
    """Inside a Jupyter kernel (IPython already imported by it; never imported here)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None) is not None


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
    return f"{prefix(command)} " + ", ".join(parts) + f"; top: {shown(top, one_line=True)}"


def change_line(c: Change, command: str = "watch") -> str:
    return f"{prefix(command)} CHANGE ({c.kind}) {shown(c.text, one_line=True)}"


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
            if not e.again:
                print(window_line(e.window, self.command), file=self.stream, flush=True)
            for c in e.changes:
                print(change_line(c, self.command), file=self.stream, flush=True)

    def job_output(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def close(self) -> None:
        return None


class PanelState:
    """What the panel shows: the latest window, the rate over all windows so far, the last change."""

    def __init__(self, command: str = "watch", overall: str = "over the run") -> None:
        self.command, self.overall = command, overall
        self.last_step = 0
        self.now: WindowSummary | None = None
        self._tokens = 0.0  # tokens/s × seconds summed over windows (the run's rate without keeping windows)
        self._seconds = 0.0
        self._rated = True
        self.latest_change: Change | None = None

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
            grid.add_row("top finding", as_text("none" if top is None else f"{top.cause} ({top.severity})"))
        if self.latest_change is not None:
            grid.add_row("last change", as_text(self.latest_change.text, style="yellow"))
        return Panel(grid, title=f"pitstop {self.command}", title_align="left", expand=False)

    def take(self, events: list[Event]) -> list[Change]:
        """Fold closed windows in; the changes they brought, to print above the panel."""
        changes: list[Change] = []
        for e in events:
            if not e.again:  # a window counts once in the rate over the run
                self.now = e.window
                self._seconds += e.window.seconds
                if e.window.tokens_per_s is None:
                    self._rated = False
                else:
                    self._tokens += e.window.tokens_per_s * e.window.seconds
                self.last_step = max(self.last_step, e.window.last_step)
            for c in e.changes:
                self.latest_change = c
                changes.append(c)
        return changes


class LiveView(PanelState):
    """A rich panel below the job's output, redrawn in place; the job's lines and each change are printed above
    it, so nothing scrolls away under the panel."""

    def __init__(
        self, console: Console | None = None, command: str = "watch", overall: str = "over the run"
    ) -> None:
        super().__init__(command, overall)
        self.console = console or Console(stderr=True)
        self.live = Live(self._panel(), console=self.console, refresh_per_second=2, transient=False)
        self.live.start()

    def step(self, n: int) -> None:
        if n != self.last_step:
            self.last_step = n
            self.live.update(self._panel())

    def events(self, events: list[Event]) -> None:
        for c in self.take(events):
            self.live.console.print(Text(change_line(c, self.command), style="yellow"))  # already shown()
        self.live.update(self._panel())

    def job_output(self, text: str) -> None:
        self.live.console.out(text.rstrip("\n"), highlight=False)

    def close(self) -> None:
        self.live.update(Group(self._panel()))
        self.live.stop()


class NotebookView(PanelState):
    """The same panel as HTML in one IPython display handle, updated in place (``display_id``); changes are
    printed as lines above it. A notebook shows no cursor escapes, so rich's live redraw is not used here."""

    def __init__(self, command: str = "watch", overall: str = "over the run") -> None:
        super().__init__(command, overall)
        from IPython.display import display

        self._shown = ""
        self.handle: Any = display(self._html(), display_id=True)

    def _html(self) -> Any:
        from IPython.display import HTML

        console = Console(
            file=io.StringIO(), record=True, width=100, force_jupyter=False
        )  # rich would display it
        console.print(self._panel())
        return HTML(console.export_html(inline_styles=True, code_format=_PRE))

    def _refresh(self) -> None:
        if self.handle is not None:
            self.handle.update(self._html())

    def step(self, n: int) -> None:
        if n != self.last_step:
            self.last_step = n
            self._refresh()

    def events(self, events: list[Event]) -> None:
        for c in self.take(events):
            print(change_line(c, self.command), flush=True)
        self._refresh()

    def job_output(self, text: str) -> None:
        print(text, end="", flush=True)

    def close(self) -> None:
        self._refresh()


_PRE = '<pre style="font-family:Menlo,Consolas,monospace;font-size:12px;line-height:1.3">{code}</pre>'


def make_view(tty: bool | None = None, command: str = "watch", overall: str = "over the run") -> View:
    """In a Jupyter kernel the HTML panel, on a terminal the rich panel, plain lines elsewhere."""
    if tty is None and in_kernel():
        return NotebookView(command, overall)
    is_tty = sys.stderr.isatty() if tty is None else tty
    return LiveView(command=command, overall=overall) if is_tty else PlainView(command=command)
