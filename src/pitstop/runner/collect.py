"""Gather what the probed processes wrote into one RunProfile, say how the job ended, and say plainly when
there is nothing.

A rank file holds whatever its process measured, even when the process died by a signal in the middle of
the window (``probe.stream``); the cause of such a death is told with the steps it left, and pitstop exits
the way a shell would for it (128 + the signal's number). A job that failed (an exit code, a signal; not a stop
by pitstop or the user) gets its ``RunProfile.failure``: the exit joined with the uncaught exception a rank's
probe recorded (``probe/collectors/failure.py``).
"""

from __future__ import annotations

import dataclasses
import math
import signal
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pitstop.core.profile import JobFailure, RankProfile, RunProfile
from pitstop.core.vocabulary import Source
from pitstop.probe.ending import lost_probes
from pitstop.probe.gather import read_summary
from pitstop.probe.stream import PATTERN, read_stream
from pitstop.runner.launch import GRACE_S, Launch
from pitstop.runner.nccl import add_nccl_links

# what a death by each signal usually means, for the one line the user reads
_WHY: dict[int, str] = {
    signal.SIGKILL: "the OOM killer's way",
    signal.SIGSEGV: "a crash in native code",
    signal.SIGBUS: "a bad memory access; a full /dev/shm does this to DataLoader workers",
    signal.SIGABRT: "an abort, as a failed assertion in native code does",
    signal.SIGFPE: "an arithmetic fault in native code",
    signal.SIGTERM: "asked to stop, as a scheduler or `kill` does",
    signal.SIGINT: "interrupted",
    signal.SIGHUP: "its terminal went away",
}
_STOPPED = {"SIGINT": 130, "SIGHUP": 129, "SIGTERM": 143, "timeout": 130}


@dataclass
class Outcome:
    profile: RunProfile | None
    message: str | None  # one line for the user when there is nothing to diagnose, or a caveat
    exit_code: int  # what pitstop itself should exit with


@dataclass
class RankFile:
    profile: RankProfile
    finished: bool  # the process wrote its whole profile (False: rebuilt after it died)


def read_rank_files(out_dir: Path) -> list[RankFile]:
    by_rank: dict[int, RankFile] = {}
    for path in sorted(out_dir.glob(PATTERN)):
        read = read_stream(path)
        if read is None:
            continue
        rank = RankFile(*read)
        current = by_rank.get(rank.profile.rank)
        if current is None or len(rank.profile.steps) > len(current.profile.steps):
            by_rank[rank.profile.rank] = rank
    return [by_rank[k] for k in sorted(by_rank)]


def armed_processes(out_dir: Path) -> int:
    return len(list(out_dir.glob("armed-*")))


# modules whose presence in an armed process means the training ran in workers that a launcher started
_LAUNCHERS = {"ray": "Ray", "deepspeed.launcher": "DeepSpeed's launcher"}
_LAUNCHER_COMMANDS = {"deepspeed": "DeepSpeed's launcher", "ray": "Ray", "mpirun": "mpirun", "srun": "srun"}


def _launcher_without_ranks(launch: Launch) -> str | None:
    """The launcher whose workers should have reported and did not: named by the command itself
    (``deepspeed train.py``) or by the modules an armed process had loaded when it ended (Ray's driver)."""
    first = launch.command[0].rsplit("/", 1)[-1] if launch.command else ""
    if first in _LAUNCHER_COMMANDS:
        return _LAUNCHER_COMMANDS[first]
    for path in launch.out_dir.glob("launchers-*"):
        try:
            names = path.read_text().split()
        except OSError:
            continue
        for module, name in _LAUNCHERS.items():
            if module in names:
                return name
    return None


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def death(launch: Launch) -> tuple[str | None, int]:
    """How the command ended, as a phrase that fits "the job …" (None: it exited 0), and the exit code pitstop
    takes from it: the command's own, or 128 + N for a signal, as a shell reports it."""
    code = launch.exit_code if launch.exit_code is not None else 1
    if launch.stopped_by is not None:
        by = launch.stopped_by
        what = {
            "timeout": "was stopped at its --timeout",
            "SIGINT": "was interrupted (Ctrl-C)",
        }.get(by, f"was stopped because pitstop got {by}")
        if launch.forced:
            # what it was sent: SIGINT alone at the timeout, SIGINT then SIGTERM otherwise
            sent = f"within {GRACE_S:.0f} s of SIGINT" if by == "timeout" else "on SIGINT or SIGTERM"
            what += f", did not end {sent}, and was killed with SIGKILL"
        return what, _STOPPED.get(by, 130)
    if code < 0:
        number = -code
        why = _WHY.get(number)
        return f"was killed by {signal_name(number)}" + (f" ({why})" if why else ""), 128 + number
    if code > 128 and code - 128 in _WHY:  # a shell or launcher in between reports its child's death so
        name = signal_name(code - 128)
        return f"exited with code {code} (a death by {name} as a shell reports it: {_WHY[code - 128]})", code
    if code != 0:
        return f"exited with code {code}", code
    return None, 0


def job_failure(launch: Launch, ranks: list[RankProfile]) -> JobFailure | None:
    """How the job failed, or None: it exited 0, or pitstop or the user stopped it (an interruption is no
    failure). The exit as the runner saw it (the code, or the signal that killed it), with the exception a
    rank recorded: the main thread's over a thread's, of several ranks the first raised (the others most
    often fail on it)."""
    if launch.stopped_by is not None or launch.ended_after_window or launch.probe_lost is not None:
        return None
    code = launch.exit_code if launch.exit_code is not None else 1
    if code == 0:
        return None
    raised = [r.failure for r in ranks if r.failure is not None]
    first = min(raised, key=lambda f: (f.thread is not None, f.at or math.inf)) if raised else JobFailure()
    if code < 0:
        return dataclasses.replace(first, exit_code=None, signal=signal_name(-code))
    by_shell = signal_name(code - 128) if code > 128 and code - 128 in _WHY else None
    return dataclasses.replace(first, exit_code=code, signal=by_shell)


def merge(
    ranks: list[RankProfile],
    source: Source,
    requested_steps: int | None,
    command: list[str] | None = None,
    exit_code: int | None = None,
) -> RunProfile:
    """The RunProfile of one run from its ranks' profiles (the runner's files or an in-process session)."""
    return RunProfile(
        source=source,
        ranks=ranks,
        command=command,
        started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        requested_steps=requested_steps,
        exit_code=exit_code,
    )


def collect(
    launch: Launch, requested_steps: int | None, requested_warmup: int, source: Source = Source.DOCTOR
) -> Outcome:
    cmd = " ".join(launch.command)
    if launch.start_error:
        return Outcome(None, launch.start_error, 127)
    lost = launch.probe_lost or (None if launch.ended_after_window else lost_probes(launch.out_dir))
    if lost is not None:  # no whole window can come from a run whose probe was lost: one line says why
        ended = "pitstop stopped the job: no window would come" if launch.probe_lost else "the job ended"
        said = f"the probe failed{lost.where} in `{cmd}`: {lost.error} ({ended})"
        return Outcome(None, said, 1 if launch.probe_lost else death(launch)[1] or 1)
    files = read_rank_files(launch.out_dir)
    ranks = [f.profile for f in files]
    how, code = death(launch)
    gathered = read_summary(launch.out_dir)
    # rank 0 is here only if it measured steps: a launcher's own process (torchrun's agent, stopped with the
    # job) leaves a step-less file under the default rank 0
    if (
        gathered is not None
        and gathered.get("role") == "sent"
        and not any(r.rank == 0 and r.steps for r in ranks)
    ):
        where = gathered.get("rank0_node") or "the node of global rank 0 (it did not answer)"
        return Outcome(
            None, f"the ranks run here sent their measurements to rank 0: the job's report is on {where}", 0
        )
    if not any(r.steps for r in ranks):
        return _nothing(launch, ranks, cmd, how, code)
    profile = merge(ranks, source, requested_steps, launch.command, code)
    first = profile.ranks[0].environment  # the profile's environment: NCCL's choices join its links
    first.links = add_nccl_links(first.links, launch.out_dir)
    if gathered is not None and gathered.get("missing_ranks"):
        profile.missing_ranks = list(gathered["missing_ranks"])
        profile.missing_hosts = list(gathered.get("missing_nodes") or [])
        nodes = ", ".join(profile.missing_hosts) or "their nodes"
        profile.notes.append(
            f"ranks {', '.join(map(str, profile.missing_ranks))} ({nodes}) did not report in time: "
            "the diagnosis covers the ranks that did"
        )
    stopped = any(r.stopped_by_probe for r in ranks)
    measured = min(len(r.steps) for r in ranks if r.steps)
    message = None
    exit_code = 0
    if launch.stopped_by == "SIGINT" and not launch.forced:
        message = "interrupted: the diagnosis covers the steps measured before Ctrl-C"
        exit_code = code
    elif launch.stopped_by is not None or code > 128:
        message = f"the job {how} after {measured} measured steps; the diagnosis covers them"
        exit_code = code
    elif how is not None and not stopped:
        message = f"`{cmd}` {how}; the diagnosis covers the steps measured before that"
        exit_code = code
    if message is not None:
        profile.notes.append(message)
    profile.exit_code = exit_code
    profile.failure = job_failure(launch, ranks)
    if requested_steps is not None and measured < requested_steps and not launch.interrupted:
        note = f"the run ended after {measured} measured steps (asked for {requested_steps})"
        profile.notes.append(note)
    if any(r.warmup_steps < requested_warmup and r.steps for r in ranks):
        profile.notes.append("the run ended inside the warm-up; steps after the first are reported")
    return Outcome(profile, message, exit_code)


def _nothing(launch: Launch, ranks: list[RankProfile], cmd: str, how: str | None, code: int) -> Outcome:
    """Why there is no step to diagnose, in one line."""
    if launch.stopped_by is not None:
        if launch.stopped_by == "SIGINT" and not launch.forced:
            return Outcome(None, "interrupted before any step was measured", code)
        return Outcome(None, f"the job {how} before any step was measured", code)
    errors = [e for r in ranks for e in r.probe_errors]
    if errors:
        return Outcome(None, f"the probe failed in `{cmd}`: {errors[0]}", code or 1)
    launcher = _launcher_without_ranks(launch) if how is None else None  # a failed job says its own error
    if launcher is not None:
        return Outcome(
            None,
            f"no rank reported: {launcher} did not pass PITSTOP_OUT (and pitstop's other PITSTOP_ variables) "
            "to its workers; see docs/where-it-runs.md",
            code or 2,
        )
    if armed_processes(launch.out_dir) == 0:
        return Outcome(
            None,
            f"`{cmd}` {how or 'exited with code 0'} and no Python process of it imported torch, so there was "
            "nothing to observe (a wrapper that clears the environment, like `env -i` or `sudo`, hides it)",
            code or 2,
        )
    if how is not None:
        failure = job_failure(launch, ranks)
        raised = f": {failure.describe()}" if failure is not None and failure.exception else ""
        return Outcome(None, f"`{cmd}` {how} before its first optimizer step{raised}", code)
    return Outcome(
        None,
        f"`{cmd}` finished without a training step to measure (a step ends at optimizer.step(), or at the "
        "model's next forward once its parameters changed; a script that only evaluates, or trains fewer "
        "than 2 steps, has none)",
        2,
    )
