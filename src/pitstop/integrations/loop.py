"""The plain-loop API: observe the optimizer steps run inside a ``with`` block.

import pitstop
with pitstop.watch(steps=50, warmup=10, json_path="run.json"):
    for batch in loader:
        loss = model(**batch).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad()

``mode="watch"`` watches the whole block instead (windows, changes, periodic stalls) and logs each window to
trackers: inside an Accelerate job that called ``accelerator.init_trackers``, into the job's own trackers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pitstop.core.vocabulary import Source
from pitstop.integrations.session import Session


@contextmanager
def watch(
    steps: int | None = 50,
    warmup: int = 10,
    json_path: str | Path | None = None,
    report: bool = True,
    live: bool | None = None,
    mode: str = "window",
    window_steps: int = 200,
    window_seconds: float | None = None,
    report_to: str | None = None,
    logdir: str | Path = "runs",
    accelerator: Any = None,
) -> Iterator[Session]:
    """Measure ``steps`` optimizer steps after ``warmup``; the diagnosis is printed when they are done
    (or when the block ends) and is kept on the returned session as ``.diagnosis``. ``live``: show the
    watch's panel meanwhile (None: in a Jupyter kernel only, as a display updated in place).

    ``mode="watch"``: every step of the block, cut into windows of ``window_steps`` (or ``window_seconds``);
    each window goes to ``accelerator``'s trackers (found among the callers' variables when not given) or
    else to ``report_to`` (``tensorboard,wandb,mlflow,trackio``, TensorBoard under ``logdir``). The whole-run
    report is kept as ``session.watch_report``."""
    if mode not in ("window", "watch"):
        raise ValueError("mode is 'window' (a short measured window) or 'watch' (the whole block)")
    whole = mode == "watch"
    session = Session(
        steps=None if whole else steps,
        warmup=warmup,
        json_path=json_path,
        report=report,
        source=Source.WATCH,
        live=False if whole else live,
    ).start()
    if whole:
        _watch_whole(session, window_steps, window_seconds, report_to, logdir, accelerator)
    try:
        yield session
    finally:
        session.stop()
        if session.watching is not None:
            findings = session.diagnosis.findings if session.diagnosis is not None else []
            session.watch_report = session.watching.close(None, findings)


def _watch_whole(
    session: Session,
    window_steps: int,
    window_seconds: float | None,
    report_to: str | None,
    logdir: str | Path,
    accelerator: Any,
) -> None:
    from pitstop.integrations.watching import InProcessWatch, find_accelerator, loop_trackers
    from pitstop.wholerun.windows import WindowSpec

    probe = session.probe
    assert probe is not None
    trackers = loop_trackers(report_to, logdir, accelerator or find_accelerator())
    watching = InProcessWatch(WindowSpec(window_steps, window_seconds), trackers)
    session.watching = watching

    def poll(p: Any) -> None:
        watching.poll(p)

    probe.step_listeners.append(lambda: probe.guard(poll, probe))
