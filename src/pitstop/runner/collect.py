"""Gather what the probed processes wrote into one RunProfile, and say plainly when there is nothing."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pitstop.probe.gather import read_summary
from pitstop.profile import RankProfile, RunProfile, from_jsonable
from pitstop.runner.launch import Launch


@dataclass
class Outcome:
    profile: RunProfile | None
    message: str | None  # one line for the user when there is nothing to diagnose, or a caveat
    exit_code: int  # what pitstop itself should exit with


def read_ranks(out_dir: Path) -> list[RankProfile]:
    """One profile per rank (the process with the most steps when a rank appears twice)."""
    by_rank: dict[int, RankProfile] = {}
    for path in sorted(out_dir.glob("rank-*.json")):
        try:
            rank = from_jsonable(RankProfile, json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        current = by_rank.get(rank.rank)
        if current is None or len(rank.steps) > len(current.steps):
            by_rank[rank.rank] = rank
    return [by_rank[k] for k in sorted(by_rank)]


def armed_processes(out_dir: Path) -> int:
    return len(list(out_dir.glob("armed-*")))


def collect(
    launch: Launch, requested_steps: int | None, requested_warmup: int, source: str = "doctor"
) -> Outcome:
    cmd = " ".join(launch.command)
    if launch.start_error:
        return Outcome(None, launch.start_error, 127)
    ranks = read_ranks(launch.out_dir)
    code = launch.exit_code if launch.exit_code is not None else 1
    gathered = read_summary(launch.out_dir)
    if gathered is not None and gathered.get("role") == "sent" and not any(r.rank == 0 for r in ranks):
        where = gathered.get("rank0_node") or "the node of global rank 0 (it did not answer)"
        return Outcome(
            None, f"this node's ranks sent their measurements to rank 0: the job's report is on {where}", 0
        )
    if launch.interrupted and not any(r.steps for r in ranks):
        return Outcome(None, "interrupted before any step was measured", 130)
    if not any(r.steps for r in ranks):
        errors = [e for r in ranks for e in r.probe_errors]
        if errors:
            return Outcome(None, f"the probe failed in `{cmd}`: {errors[0]}", code or 1)
        if armed_processes(launch.out_dir) == 0:
            return Outcome(
                None,
                f"`{cmd}` exited with code {code} and no Python process of it imported torch, so there was "
                "nothing to observe (a wrapper that clears the environment, like `env -i` or `sudo`, hides it)",
                code or 2,
            )
        if code != 0:
            return Outcome(None, f"`{cmd}` exited with code {code} before its first optimizer step", code)
        return Outcome(
            None,
            f"`{cmd}` finished without an optimizer step to measure (pitstop times optimizer.step(); "
            "a script that only evaluates, or steps fewer than 2 times, has none)",
            2,
        )
    profile = RunProfile(
        source=source,
        ranks=ranks,
        command=launch.command,
        started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        requested_steps=requested_steps,
        exit_code=launch.exit_code,
    )
    if gathered is not None and gathered.get("missing_ranks"):
        profile.missing_ranks = list(gathered["missing_ranks"])
        profile.missing_hosts = list(gathered.get("missing_nodes") or [])
        nodes = ", ".join(profile.missing_hosts) or "their nodes"
        profile.notes.append(
            f"ranks {', '.join(map(str, profile.missing_ranks))} ({nodes}) did not report in time: "
            "the diagnosis covers the ranks that did"
        )
    stopped = any(r.stopped_by_probe for r in ranks)
    message = None
    exit_code = 0
    if launch.interrupted:
        message = "interrupted: the diagnosis covers the steps measured before Ctrl-C"
        exit_code = 130
    elif not stopped and code != 0:
        message = f"`{cmd}` exited with code {code}; the diagnosis covers the steps measured before that"
        exit_code = code
    measured = min(len(r.steps) for r in ranks if r.steps)
    if requested_steps is not None and measured < requested_steps and not launch.interrupted:
        note = f"the run ended after {measured} measured steps (asked for {requested_steps})"
        profile.notes.append(note)
    if any(r.warmup_steps < requested_warmup and r.steps for r in ranks):
        profile.notes.append("the run ended inside the warm-up; steps after the first are reported")
    return Outcome(profile, message, exit_code)
