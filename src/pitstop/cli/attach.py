"""``pitstop attach PID`` (registered in app.py): sample a running job from outside for a window, then the
same RunProfile -> rules -> report as doctor. Imported when the command runs; the work imported inside."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pitstop.cli.errors import UserError

MIN_SECONDS, MAX_RATE = 2.0, 250.0


def parse_window(text: str) -> float:
    """'30s', '2m', '45' -> seconds (at least 2)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise UserError(f"--for: {text!r} is not a duration (e.g. 30s, 2m)")
    value = float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
    if value < MIN_SECONDS:
        raise UserError(f"--for: at least {MIN_SECONDS:g}s (a step has to be seen more than once)")
    return value


def run_attach(pid: int, seconds: float, rate: float, json_out: Path | None, sample: bool = False) -> int:
    from datetime import datetime, timezone

    from pitstop.attach.procs import AttachRefused, check_pid
    from pitstop.cli.money import resolve_price, with_savings
    from pitstop.cli.outputs import Outputs

    outputs = Outputs(json_out)
    outputs.check()
    price = resolve_price(None)  # $PITSTOP_PRICE_PER_GPU_HOUR, refused before the window when it is bad
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        check_pid(pid)
    except AttachRefused as exc:
        raise UserError(str(exc), 2) from None
    diagnosis, why_not = (None, "--sample asked for sampling") if sample else _probed(pid, seconds, started)
    if diagnosis is None:
        diagnosis = _sampled(pid, seconds, rate, started)
        diagnosis.notes.insert(0, f"full probe not armed ({why_not}): the stacks were sampled instead")
    from pitstop.report.terminal import render

    with_savings(diagnosis, price, None)  # the run's length when the job's Trainer said it, else one note
    outputs.write(diagnosis.to_dict())
    render(diagnosis, outputs.terminal())
    return 0


def _probed(pid: int, seconds: float, started: str) -> tuple[Any, str]:
    """The full probe armed in the job by sys.remote_exec for the window: (its diagnosis, '') or (None, why
    it was not used)."""
    from rich.console import Console

    from pitstop.attach import procs
    from pitstop.attach.probed import probe_window
    from pitstop.attach.remote import RemoteFailed, decide
    from pitstop.core.profile import RunProfile
    from pitstop.core.vocabulary import Source
    from pitstop.diagnose import diagnose

    decision = decide(pid)
    if not decision.ok:
        return None, decision.reason or "no interpreter to make the call"
    shown = ", ".join(map(str, decision.pids))
    try:
        with Console(stderr=True).status(
            f"arming pitstop's probe in PID {shown} by sys.remote_exec for {seconds:g} s of steps"
        ):
            ranks, notes = probe_window(decision, seconds)
    except RemoteFailed as exc:
        return None, str(exc)
    profile = RunProfile(source=Source.ATTACH, ranks=ranks, started_at=started)
    profile.command = procs.cmdline(pid) or None
    diagnosis = diagnose(profile)
    diagnosis.notes += notes
    return diagnosis, ""


def _sampled(pid: int, seconds: float, rate: float, started: str) -> Any:
    from rich.console import Console

    from pitstop.attach.build import build_profile
    from pitstop.attach.procs import AttachRefused
    from pitstop.attach.sampled import annotate
    from pitstop.attach.sampler import PySpySampler
    from pitstop.attach.view import job_view
    from pitstop.diagnose import diagnose

    try:
        with Console(stderr=True).status(
            f"sampling PID {pid} for {seconds:g} s at {rate:g} Hz (non-blocking)"
        ):
            window = PySpySampler().sample(pid, seconds, rate)
    except AttachRefused as exc:
        raise UserError(str(exc), 2) from None
    view = job_view(window)
    if not view.ranks:
        raise UserError(
            f"PID {pid}: no process showed a training loop (DataLoader, forward, backward, optimizer) in "
            f"{seconds:g} s of samples",
            2,
        )
    return annotate(diagnose(build_profile(view, started)), view)
