"""The feed behind the live views of ``pitstop watch`` and ``pitstop doctor``: the rank files' new steps go
through a ``WholeRun`` and each closed window is shown (views: ``pitstop.report.live``)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import IO, TYPE_CHECKING

from pitstop.report.live import (
    PREFIX,
    LiveView,
    NotebookView,
    PlainView,
    View,
    change_line,
    make_view,
    window_line,
)
from pitstop.runner.follow import RankFollower
from pitstop.runner.relay import at_line_start, mark_line_start
from pitstop.wholerun.run import Event, WholeRun

if TYPE_CHECKING:
    from pitstop.report.trackers import Tracker

__all__ = [
    "PREFIX",
    "Feed",
    "LiveView",
    "NotebookView",
    "PlainView",
    "View",
    "change_line",
    "make_view",
    "window_line",
]


class Feed:
    """Moves what the rank files say into the whole-run analysis, the view and the trackers; shared by
    ``watch`` (the whole run) and ``doctor`` (its short window, cut into small windows)."""

    def __init__(self, whole: WholeRun, view: View, trackers: list[Tracker], out: Path) -> None:
        self.whole, self.view, self.trackers = whole, view, trackers
        self.out = out
        self.follower = RankFollower(out)
        self.log: Path | None = None  # the job's output, when it runs quietly and the view shows it
        self.until: int | None = None  # bytes of the log to show: what follows came after pitstop's stop
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
        if events and isinstance(self.view, PlainView):
            fresh_line(self.out, self.view.stream)  # not glued onto the job's tqdm bar
        self.view.events(events)
        for e in events:
            if not e.again:  # a window is logged once; changes found at the end are in the trackers' summary
                for t in self.trackers:
                    t.log_window(e.window, e.changes)

    def _job_output(self) -> None:
        if self.log is None or not self.log.exists():
            return
        with self.log.open("rb") as f:
            f.seek(self._log_offset)
            chunk = f.read() if self.until is None else f.read(max(self.until - self._log_offset, 0))
        # whole lines only, while the job runs; up to the stop once pitstop has stopped it
        cut = chunk.rfind(b"\n") + 1 if self.until is None else len(chunk)
        if cut:
            self._log_offset += cut
            text = chunk[:cut].decode("utf-8", errors="replace")
            self.view.job_output(as_drawn(text if text.endswith("\n") else text + "\n"))


def as_drawn(text: str) -> str:
    """Each line as a terminal leaves it: a bar redrawn with ``\\r`` (tqdm) shows its last drawing, not every
    drawing glued together (a panel's console drops the ``\\r``)."""
    lines = []
    for line in text.split("\n"):
        drawings = [d for d in line.split("\r") if d.strip()]
        lines.append(drawings[-1] if drawings else "")
    return "\n".join(lines)


def fresh_line(run_folder: Path, stream: IO[str]) -> None:
    """Before a line of pitstop's on the stream the job's output is relayed to: a newline first when the job
    left its line open (a tqdm bar redrawn with ``\\r``), so pitstop's line starts at the left edge."""
    if not at_line_start(run_folder):
        stream.write("\n")
        stream.flush()
    mark_line_start(run_folder)  # pitstop's lines end with a newline
