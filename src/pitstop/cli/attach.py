"""``pitstop attach PID``: sample a running job from outside for a window, then the same RunProfile ->
rules -> report as doctor. Only typer is imported at module level (``pitstop --help`` stays light)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

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


def attach_command(
    pid: Annotated[int, typer.Argument(help="The trainer's PID, or its launcher's (torchrun, accelerate).")],
    for_: Annotated[str, typer.Option("--for", help="How long to sample (e.g. 30s, 2m).")] = "30s",
    rate: Annotated[float, typer.Option("--rate", help="Samples per second per thread.")] = 100.0,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the diagnosis as JSON (pitstop.run/1).")
    ] = None,
) -> None:
    """Diagnose a job that is already running, without restarting it: its stacks are sampled from outside
    (py-spy, non-blocking: the job is never paused) for a window.

    pitstop attach 12345 --for 60s --json now.json
    """
    from pitstop.report.untrusted import shown

    try:
        if not 1.0 <= rate <= MAX_RATE:
            raise UserError(f"--rate: between 1 and {MAX_RATE:g} samples per second")
        code = run_attach(pid, parse_window(for_), rate, json_out)
    except UserError as exc:
        typer.secho(f"pitstop: {shown(str(exc))}", err=True, fg="red")
        raise typer.Exit(exc.code) from None
    raise typer.Exit(code)


def run_attach(pid: int, seconds: float, rate: float, json_out: Path | None) -> int:
    from datetime import datetime, timezone

    from rich.console import Console

    from pitstop.attach.build import build_profile
    from pitstop.attach.procs import AttachRefused, check_pid
    from pitstop.attach.sampled import annotate
    from pitstop.attach.sampler import PySpySampler
    from pitstop.attach.view import job_view
    from pitstop.cli.outputs import Outputs
    from pitstop.diagnose import diagnose
    from pitstop.report.terminal import render

    outputs = Outputs(json_out)
    outputs.check()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        check_pid(pid)
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
    diagnosis = annotate(diagnose(build_profile(view, started)), view)
    doc = diagnosis.to_dict()
    outputs.write(doc)
    render(diagnosis, outputs.terminal())
    return 0
