"""Whole-run watching inside the training process (the callbacks' ``mode="watch"``): the probe measures every
step, this reads its new records at each step end, windows them, and sends each window to the trackers the
job already uses (the run the Trainer's ``report_to`` opened, never a second one).

Only finished records are read: a step whose device timings are still pending is read at a later step end,
and token counts still on the device are left unknown (reading them would wait for the GPU), as the runner's
per-step lines do; the final diagnosis at the end has them all.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pitstop.core.profile import StepRecord
from pitstop.diagnose.savings import price_from_env
from pitstop.probe.probe import Probe
from pitstop.probe.rankfile import on_host
from pitstop.report.trackers import Tracker, open_trackers
from pitstop.report.untrusted import shown
from pitstop.wholerun.run import Event, WholeRun, WholeRunReport
from pitstop.wholerun.windows import WindowSpec


class InProcessWatch:
    def __init__(
        self,
        spec: WindowSpec,
        trackers: list[Tracker],
        min_drop: float = 0.10,
        print_changes: bool = True,
    ) -> None:
        # this process's rank only; each window's cost at $PITSTOP_PRICE_PER_GPU_HOUR, as the final report's
        self.whole = WholeRun(spec, min_drop, ranks=1, price=price_from_env())
        self.trackers = trackers
        self.print_changes = print_changes
        self._next = 0  # position in probe.records not yet read
        self.report: WholeRunReport | None = None

    def poll(self, probe: Probe) -> list[Event]:
        """Feed the probe's finished records since the last call."""
        pending = {id(r) for r, _ in probe.builder._unresolved}
        records = probe.records
        fresh: list[StepRecord] = []
        while self._next < len(records) and id(records[self._next]) not in pending:
            record = records[self._next]
            self._next += 1
            if record.index > probe.config.warmup:
                fresh.append(on_host(record))  # as the rank file's step lines hold it
        if not fresh:
            return []
        events = self.whole.add(probe.rank, fresh, probe.environment)
        self._publish(events, probe.rank)
        return events

    def _publish(self, events: list[Event], rank: int) -> None:
        for e in events:
            if not e.again:  # a window is logged once; changes found at the end are in the trackers' summary
                for t in self.trackers:
                    t.log_window(e.window, e.changes)
            if self.print_changes and rank == 0:
                for (
                    c
                ) in e.changes:  # a change's text quotes the job (names, notes): no escape code of its own
                    line = f"pitstop watch: CHANGE ({c.kind}) {c.text}"
                    print(shown(line, one_line=True), file=sys.stderr, flush=True)

    def close(self, probe: Probe | None, findings: list[Any]) -> WholeRunReport:
        if probe is not None:
            self.poll(probe)
        events, report = self.whole.finish()
        self._publish(events, probe.rank if probe is not None else 0)
        for t in self.trackers:
            t.finish(report, findings)
        self.report = report
        return report


def tensorboard_dir(args: Any) -> str | None:
    """Where the Trainer's TensorBoard callback writes (its writer's folder; transformers 5 sets it from
    TENSORBOARD_LOGGING_DIR or output_dir, older ones from ``args.logging_dir``)."""
    from pitstop.probe.environment import trainer_on_stack

    _, trainer = trainer_on_stack()
    handler = getattr(trainer, "callback_handler", None)
    for cb in getattr(handler, "callbacks", []):
        if type(cb).__name__ == "TensorBoardCallback":
            writer = getattr(cb, "tb_writer", None)
            found = getattr(writer, "log_dir", None) or getattr(cb, "logging_dir", None)
            if found:
                return str(found)
    return getattr(args, "logging_dir", None)


def trainer_trackers(report_to: Any, logging_dir: str | None) -> list[Tracker]:
    """Trackers for the names in a Trainer's ``report_to`` that pitstop supports; TensorBoard writes into the
    Trainer's own log folder, so its scalars sit in the same run."""
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    known = ("tensorboard", "wandb", "mlflow", "trackio")
    if "all" in names:
        names = list(known)
    wanted = [n for n in known if n in names]
    trackers = []
    for name in wanted:
        try:
            trackers += open_trackers([name], Path(logging_dir or "runs"), same_folder=True)
        except Exception as exc:  # a tracker the job asked for but that cannot open: say so, train on
            print(f"pitstop: not logging to {name}: {exc}", file=sys.stderr)
    return trackers


def find_accelerator(depth: int = 8) -> Any:
    """An ``accelerate.Accelerator`` with trackers (``init_trackers`` was called) among the callers' locals and
    globals, nearest first; ``None`` if there is none. Nothing is imported: Accelerate is only recognised."""
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return None
        for scope in (frame.f_locals, frame.f_globals):
            for value in list(scope.values()):
                kind = type(value)
                named = kind.__name__ == "Accelerator" and kind.__module__.startswith("accelerate")
                if named and getattr(value, "trackers", None):
                    return value
        frame = frame.f_back  # type: ignore[assignment]
    return None


def loop_trackers(report_to: str | None, logdir: str | Path, accelerator: Any) -> list[Tracker]:
    """The trackers of ``pitstop.watch(mode="watch")``: the Accelerate job's own (one run per tracker, the
    job's) when it has some, else the ``report_to`` names opened by pitstop."""
    from pitstop.report.trackers import AccelerateTracker, parse_report_to

    if accelerator is not None and getattr(accelerator, "trackers", None):
        return [AccelerateTracker(accelerator)]
    return open_trackers(parse_report_to(report_to), Path(logdir))
