"""One watched run: windows closed as steps arrive, changes found as windows close, periodic stalls and the
whole-run report at the end. Fed by whatever reads the probe's output (the CLI's rank-file reader, a callback)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.core.profile import Environment, GpuSample, StepRecord
from pitstop.wholerun.changes import Change, ChangeDetector
from pitstop.wholerun.periodic import PeriodicStall, StallLog, periodic_stalls
from pitstop.wholerun.store import SeriesStore
from pitstop.wholerun.windows import Windower, WindowSpec, WindowSummary

SCHEMA_KEY = "watch"  # the key the whole-run section takes in a pitstop.run/1 document


@dataclass
class RunPhase:
    """Steps between two rate changes, with the findings any of its windows had (worst estimate kept)."""

    first_step: int
    last_step: int
    tokens_per_s: float | None
    findings: dict[str, float] = field(default_factory=dict)  # cause -> largest time-saved share

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class WholeRunReport:
    spec: WindowSpec
    windows: list[WindowSummary]
    changes: list[Change]
    stalls: list[PeriodicStall]
    phases: list[RunPhase]
    steps: int
    seconds: float
    series_path: str | None = None
    hidden_below: float | None = None  # a drop the run's noise could hide (above min_drop), else None

    def to_dict(self) -> dict[str, Any]:
        """The ``watch`` section of the run document (see docs/json-schema.md)."""
        return {
            "window": {"steps": self.spec.steps, "seconds": self.spec.seconds},
            "steps": self.steps,
            "seconds": round(self.seconds, 3),
            "windows": [w.to_dict() for w in self.windows],
            "changes": [c.to_dict() for c in self.changes],
            "periodic_stalls": [s.to_dict() for s in self.stalls],
            "phases": [p.to_dict() for p in self.phases],
            "series": self.series_path,
            "noise_hides_drops_below": self.hidden_below,
        }

    def lines(self) -> list[str]:
        """The report as plain lines (terminal and logs)."""
        out = [f"whole run: {self.steps:,} steps in {self.seconds:,.0f} s, {len(self.windows)} windows"]
        if not self.changes and self.hidden_below is not None:
            out.append(
                f"no change seen, but the run was too noisy to call it steady: its windows' rates varied so much "
                f"that a drop of up to {self.hidden_below:.0%} would not have shown"
            )
        elif not self.changes:
            out.append("no change: throughput and findings held steady through the run")
        for c in self.changes:
            out.append(f"change ({c.kind}): {c.text}")
        for s in self.stalls:
            out.append(f"periodic stall: {s.describe()}")
        for i, p in enumerate(self.phases, 1):
            rate = "unknown" if p.tokens_per_s is None else f"{p.tokens_per_s:,.0f} tokens/s"
            causes = ", ".join(f"{c} ({v:.0%})" for c, v in sorted(p.findings.items(), key=lambda kv: -kv[1]))
            out.append(
                f"phase {i}: steps {p.first_step:,}–{p.last_step:,}, {rate}; findings: {causes or 'none'}"
            )
        return out


@dataclass
class Event:
    """What a closed window brought: the summary and the changes it showed. ``again``: the window came in
    an earlier event, and this one brings only what its end showed once the run was over (a change no later
    window confirms): views print the changes, not the window a second time, and trackers logged it."""

    window: WindowSummary
    changes: list[Change]
    again: bool = False


class WholeRun:
    """Feed steps as they come (``add``); each call returns the windows it closed with their changes."""

    def __init__(
        self,
        spec: WindowSpec | None = None,
        min_drop: float = 0.10,
        series_dir: Path | None = None,
        ranks: int | None = None,
        price: float | None = None,
    ) -> None:
        """``ranks``: how many ranks feed it (1 inside one process of a multi-rank job); None: the job's.
        ``price``: per GPU-hour, for each window's cost per million real tokens (none without)."""
        self.spec = spec or WindowSpec()
        self.windower = Windower(self.spec, ranks=ranks, price=price)
        self.detector = ChangeDetector(min_drop=min_drop)
        self.stalls = StallLog()
        self.store = SeriesStore(series_dir) if series_dir is not None else None
        self.windows: list[WindowSummary] = []
        self.environment: Environment | None = None
        self._queues: dict[int, list[StepRecord]] = {}  # each rank's steps not yet in a closed window
        self._previous: list[StepRecord] = []  # rank 0's steps of the last closed window
        self._lead_rank: int | None = None
        self._unstored: dict[int, list[StepRecord]] = {}

    def add(
        self, rank: int, records: list[StepRecord], environment: Environment | None = None
    ) -> list[Event]:
        if environment is not None and (self._lead_rank is None or rank <= self._lead_rank):
            self.environment = environment
        if self._lead_rank is None or rank < self._lead_rank:
            self._lead_rank = rank
        self._queues.setdefault(rank, []).extend(records)
        if self.store is not None:
            self._unstored.setdefault(rank, []).extend(records)
        return self._events(self.windower.add(rank, records, environment))

    def add_gpu(self, rank: int, samples: list[GpuSample]) -> None:
        self.windower.add_gpu(rank, samples)

    def _events(self, closed: list[WindowSummary]) -> list[Event]:
        events = []
        for window in closed:
            lead = self._queues.get(min(self._queues), []) if self._queues else []
            mine = [s for s in lead if s.index <= window.last_step]
            for rank, queue in self._queues.items():
                self._queues[rank] = [s for s in queue if s.index > window.last_step]
            self.stalls.add(mine)
            changes = self.detector.add(window, self._previous + mine)
            self._previous = mine
            self.windows.append(window)
            self._flush(window.last_step)
            events.append(Event(window, changes))
        return events

    def _flush(self, last: int) -> None:
        if self.store is None:
            return
        for rank, queue in self._unstored.items():
            self.store.append(rank, [s for s in queue if s.index <= last])
            self._unstored[rank] = [s for s in queue if s.index > last]

    def finish(self) -> tuple[list[Event], WholeRunReport]:
        events = self._events(self.windower.finish())
        last = self.detector.finish()
        if last:
            if events:
                events[-1].changes.extend(last)
            elif self.windows:
                events.append(Event(self.windows[-1], last, again=True))
        if self.store is not None:
            for rank, queue in self._unstored.items():
                self.store.append(rank, queue)
            self._unstored = {}
        return events, self.report()

    def report(self) -> WholeRunReport:
        seconds = sum(w.seconds for w in self.windows)
        env = self.environment
        known = {}
        if env is not None:
            known = {
                "evaluation": env.eval_steps,
                "checkpoint save": env.save_steps,
                "logging": env.logging_steps,
            }
        return WholeRunReport(
            spec=self.spec,
            windows=list(self.windows),
            changes=list(self.detector.changes),
            stalls=periodic_stalls(self.stalls, known, seconds),
            phases=phases(self.windows, self.detector.changes),
            steps=sum(w.steps for w in self.windows),
            seconds=seconds,
            series_path=None if self.store is None else str(self.store.folder),
            hidden_below=self.detector.hidden_below(),
        )


def phases(windows: list[WindowSummary], changes: list[Change]) -> list[RunPhase]:
    """Cut the run at its rate changes; each phase keeps its windows' findings."""
    # a phase starts with the window that holds the change's first step (a change is often seen a window later)
    starts = {
        next((w.index for w in windows if w.first_step <= c.step <= w.last_step), c.window)
        for c in changes
        if c.kind in ("slower", "faster")
    }
    groups: list[list[WindowSummary]] = []
    for w in windows:
        if not groups or w.index in starts:
            groups.append([])
        groups[-1].append(w)
    out = []
    for group in groups:
        rates = [w.tokens_per_s for w in group if w.tokens_per_s is not None]
        weights = [w.seconds for w in group if w.tokens_per_s is not None]
        tps = None
        if rates and sum(weights):
            tps = sum(r * s for r, s in zip(rates, weights, strict=True)) / sum(weights)
        findings: dict[str, float] = {}
        for w in group:
            for f in w.findings:
                findings[f.cause] = max(findings.get(f.cause, 0.0), f.time_saved_frac)
        out.append(RunPhase(group[0].first_step, group[-1].last_step, tps, findings))
    return out
