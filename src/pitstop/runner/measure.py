"""The one measuring pipeline: run a command under the probe for a window of steps and hand back its RunProfile.

``pitstop doctor`` (and its demo) and every window of ``pitstop tune`` go through :func:`measure`; they differ
only in what they do with the result. In-process sessions (``pitstop.watch``, the callbacks) have no command
to run and share the merge step (``collect.merge``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pitstop.core.profile import RunProfile
from pitstop.core.vocabulary import Source
from pitstop.probe.config import ProbeConfig
from pitstop.probe.stopping import WindowRule
from pitstop.runner.collect import collect, death
from pitstop.runner.launch import Launch, run_observed

LOG_TAIL_LINES = 200


@dataclass(frozen=True)
class StepWindow:
    """Which optimizer steps to measure: ``warmup`` first, then ``steps`` (None: until the job ends), or with
    a ``rule``, a warm-up until the steps settle and a window until their mean is precise enough (a job of
    several ranks keeps ``steps`` and ``warmup``)."""

    steps: int | None
    warmup: int
    rule: WindowRule | None = None


@dataclass
class Measurement:
    profile: RunProfile | None  # None: nothing was measured (``message`` says why)
    message: str | None  # one line for the user: why nothing was measured, or how the job ended
    exit_code: int  # what pitstop should exit with (the job's code, 128 + N for a signal, 130 for Ctrl-C)
    launch: Launch
    log_tail: list[str] = field(default_factory=list)  # the job's last output lines, when it ran quietly
    death: str | None = None  # how the job ended when not by itself or the probe: "was killed by SIGKILL (…)"

    @property
    def stopped_by_probe(self) -> bool:
        """The probe ended the job once its window was measured (the normal end of a window)."""
        return self.profile is not None and any(r.stopped_by_probe for r in self.profile.ranks)


def measure(
    command: list[str],
    window: StepWindow,
    *,
    quiet: bool = True,
    on_step: Callable[[int], None] | None = None,
    timeout_s: float | None = None,
    extra_env: dict[str, str] | None = None,
    out_dir: Path | None = None,
    source: Source = Source.DOCTOR,
    on_tick: Callable[[Path], None] | None = None,
    output_log: Path | None = None,
) -> Measurement:
    """Run ``command`` under the probe, wait for it, and collect what its processes measured. Never raises
    for the command's own failures. ``on_step`` hears rank 0's latest optimizer step while the job runs.
    ``on_tick`` gets the probe's folder at each tick (the live view reads the rank files there). ``out_dir``,
    when given, is the caller's (it may hold more than the probe's files) and is kept; otherwise a private
    folder is used and removed. ``output_log``: where the job's whole output is kept (default: in the run
    folder)."""
    config = ProbeConfig(
        warmup=window.warmup,
        steps=window.steps,
        stop_when_done=window.steps is not None or window.rule is not None,
        announce=not quiet,
        auto=window.rule,
    )
    own = out_dir is None
    folder = out_dir if out_dir is not None else Path(tempfile.mkdtemp(prefix="pitstop-"))

    def tick(where: Path) -> None:
        if on_tick is not None:
            on_tick(where)
        if on_step is None:
            return
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            on_step(int(json.loads((where / "progress.json").read_text())["step"]))

    try:
        launch = run_observed(
            command,
            config,
            quiet=quiet,
            on_tick=tick if on_step is not None or on_tick is not None else None,
            out_dir=folder,
            timeout_s=timeout_s,
            extra_env=extra_env,
            output_log=output_log,
        )
        adaptive = (
            window.rule is not None
        )  # the probe chose the warm-up and the length: nothing to hold it to
        outcome = collect(
            launch, None if adaptive else window.steps, 0 if adaptive else window.warmup, source=source
        )
        how, _ = death(launch)
        by_signal = launch.stopped_by is not None or (launch.exit_code or 0) < 0
        return Measurement(
            outcome.profile,
            outcome.message,
            outcome.exit_code,
            launch,
            _tail(launch) if quiet else [],  # shown as it ran otherwise
            how if by_signal else None,
        )
    finally:
        if own:
            shutil.rmtree(folder, ignore_errors=True)


def _tail(launch: Launch) -> list[str]:
    if launch.log_path is None or not launch.log_path.exists():
        return []
    with contextlib.suppress(OSError):
        return launch.log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    return []
