"""One window of the full probe in a running job (``remote.decide`` said it can be armed): the arm script sent
to every rank by ``sys.remote_exec``, the ranks' RankProfiles read as each job process writes its own (whole
or not at all), and the disarm script sent in a ``finally`` whatever happened (pitstop interrupted included).
What pitstop cannot do after a SIGKILL, the watchdog armed in the job does (``inject``)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pitstop.attach import inject
from pitstop.attach.remote import Decision, RemoteFailed, call, make_plan, read_status, script_text
from pitstop.core.profile import RankProfile, from_jsonable
from pitstop.interrupts import terminate_as_interrupt

Caller = Callable[[list[str], int, Path], None]
POLL_S = 0.2
DISARM_WAIT_S = 10.0


def probe_window(
    decision: Decision, seconds: float, steps: int | None = None, caller: Caller = call
) -> tuple[list[RankProfile], list[str]]:
    """Arm, collect, disarm: the ranks' profiles and what to note about the window. RemoteFailed when no
    profile came (the reason is the fallback's)."""
    assert decision.caller is not None
    folder = Path(tempfile.mkdtemp(prefix="pitstop-attach-"))
    plan = make_plan(folder, seconds, steps)
    arm_script, disarm_script = folder / "arm.py", folder / "disarm.py"
    for path, action in ((arm_script, "arm"), (disarm_script, "disarm")):
        path.write_text(script_text(action, plan, decision.pids[0]))
        share_with(path, decision.pids[0])
    share_with(folder, decision.pids[0])  # last: root writes nothing into a folder the job's user owns
    # SIGTERM / SIGHUP to pitstop (a closed terminal, kill, a job scheduler) must not end it with the probe
    # still armed in the job: the finally disarms; a second signal during the disarm is ignored
    with terminate_as_interrupt(_disarming, once=True):
        return _window(decision, seconds, caller, folder, plan)


def _disarming(signum: int) -> KeyboardInterrupt:
    return KeyboardInterrupt(f"pitstop received signal {signum}: disarming")


def _window(
    decision: Decision, seconds: float, caller: Caller, folder: Path, plan: dict[str, Any]
) -> tuple[list[RankProfile], list[str]]:
    """The arm, the waits, and the disarm in a ``finally`` (the scripts already written in ``folder``)."""
    assert decision.caller is not None
    arm_script, disarm_script = folder / "arm.py", folder / "disarm.py"
    called: list[int] = []
    notes: list[str] = []
    try:
        for pid in decision.pids:
            caller(decision.caller, pid, arm_script)
            called.append(pid)

        def resend(pid: int) -> None:
            caller(decision.caller or [], pid, arm_script)

        arm_by = float(plan["arm_by"])
        armed = wait_for(
            folder, decision.pids, "armed", arm_by + 1.0, skip_idle=True, resend=resend, resend_by=arm_by
        )
        if not armed:
            shown = ", ".join(map(str, decision.pids))
            raise RemoteFailed(f"no process of PID {shown} has imported torch: none is a training process")
        notes.append(_armed_note(armed, decision, seconds))
        return wait_profiles(folder, list(armed), float(plan["expires_at"])), notes
    finally:
        confirmed = _disarm(called, decision.caller, disarm_script, folder, caller)
        if confirmed:
            shutil.rmtree(folder, ignore_errors=True)
            notes.append("disarmed: every patch restored in the job (confirmed by each process)")
        elif called:
            notes.append(
                f"not every process confirmed the disarm within {DISARM_WAIT_S:g} s; the watchdog armed in the "
                f"job removes the probe by itself at its deadline ({folder} kept)"
            )


def share_with(path: Path, pid: int) -> None:
    """pitstop as root attaching to another user's job: the folder and scripts must be that user's to read
    and write (the job writes its profile there)."""
    if os.geteuid() != 0:
        return
    with contextlib.suppress(OSError):
        st = os.stat(f"/proc/{pid}")
        if st.st_uid != 0:
            os.chown(path, st.st_uid, st.st_gid)


def wait_for(
    folder: Path,
    pids: list[int],
    kind: str,
    deadline: float,
    skip_idle: bool = False,
    resend: Callable[[int], None] | None = None,
    resend_by: float | None = None,
) -> dict[int, dict[str, object]]:
    """Each PID's ``kind`` status; RemoteFailed at the first refusal or error, or at the deadline.
    ``skip_idle``: a process that refused because it never imported torch (a shell's other child, a logger)
    is left out of the answer instead. ``resend``: a process that said 'later' (mid-forward) is sent the
    script again after a short random pause, until ``resend_by`` (the plan's arm_by: a script the job runs
    after it arms nothing, and its refusal would hide the mid-forward reason)."""
    seen: dict[int, dict[str, object]] = {}
    idle: set[int] = set()
    tries: dict[int, int] = {}  # 'later' answers per PID
    while True:
        for pid in pids:
            later = inject.status_path(folder, "later", pid)
            if resend is not None and later.exists():
                later.unlink()
                tries[pid] = tries.get(pid, 0) + 1
                time.sleep(random.uniform(0.02, 0.2))  # not in step with the job's forwards
                if resend_by is None or time.time() < resend_by:
                    resend(pid)
            refused = read_status(folder, "refused", pid)
            if refused is not None and refused.get("not_training") and skip_idle:
                idle.add(pid)
                continue
            late = refused is not None and (refused.get("late") or refused.get("reason") == inject.LATE)
            if late and tries.get(pid):
                raise RemoteFailed(_mid_forward(pid, tries[pid] + 1))
            _raise_if_failed(folder, pid)
            status = read_status(folder, kind, pid)
            if status is not None:
                seen[pid] = status
        if len(seen) + len(idle) == len(pids):
            return seen
        if time.time() > deadline:
            missing = [p for p in pids if p not in seen and p not in idle]
            if tries.get(missing[0]):
                raise RemoteFailed(_mid_forward(missing[0], tries[missing[0]]))
            raise RemoteFailed(
                f"PID {missing[0]} did not run pitstop's script in time (its main thread never reached a "
                "Python bytecode: blocked in C code, or stopped)"
            )
        time.sleep(POLL_S)


def _mid_forward(pid: int, times: int) -> str:
    return (
        f"PID {pid} was inside a model's forward each of the {times} times pitstop's script ran (the probe "
        "is armed between two forwards only)"
    )


def _raise_if_failed(folder: Path, pid: int, what: str = "did not arm the probe") -> None:
    for kind in ("refused", "error"):
        status = read_status(folder, kind, pid)
        if status is not None:
            why = status.get("reason") or status.get("error")
            raise RemoteFailed(f"PID {pid} {what}: {why}")


def wait_profiles(folder: Path, pids: list[int], deadline: float) -> list[RankProfile]:
    profiles: dict[int, RankProfile] = {}
    while len(profiles) < len(pids):
        for pid in pids:
            if pid in profiles:
                continue
            _raise_if_failed(folder, pid, "was armed but gave no profile")
            path = inject.profile_path(folder, pid)
            if path.exists():
                profiles[pid] = read_profile(path)
        if len(profiles) == len(pids):
            break
        if time.time() > deadline:
            raise RemoteFailed(
                "the probe's window did not complete before its deadline (the job took too few optimizer "
                "steps: stopped, evaluating, or a step longer than the window)"
            )
        time.sleep(POLL_S)
    return sorted(profiles.values(), key=lambda r: r.rank)


def read_profile(path: Path) -> RankProfile:
    try:
        return from_jsonable(RankProfile, json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise RemoteFailed(f"the job's profile {path} could not be read: {exc}") from None


def _disarm(called: list[int], command: list[str], script: Path, folder: Path, caller: Caller) -> bool:
    """The disarm script to every process that was sent the arm script; True when each confirmed it."""
    for pid in called:
        with contextlib.suppress(RemoteFailed):
            caller(command, pid, script)
    if not called:
        return True
    return wait_disarmed(folder, called, time.time() + DISARM_WAIT_S)


def wait_disarmed(folder: Path, pids: list[int], deadline: float) -> bool:
    """True once each PID wrote its ``disarmed`` file. Only those are read: a process's earlier ``refused`` or
    ``error`` file (a logger that never imported torch, a window that failed) says nothing of its disarm."""
    while True:
        if all(inject.status_path(folder, "disarmed", pid).exists() for pid in pids):
            return True
        if time.time() > deadline:
            return False
        time.sleep(POLL_S)


def _armed_note(armed: dict[int, dict[str, object]], decision: Decision, seconds: float) -> str:
    first = next(iter(armed.values()))
    command = decision.caller or ["?"]
    own = command[0] == sys.executable
    via = "pitstop's own interpreter" if own else f"the job's own executable ({command[0]})"
    return (
        f"full probe: armed in PID {', '.join(map(str, armed))} by sys.remote_exec (PEP 768; Python "
        f"{first.get('python')}, torch {first.get('torch')}, the call made by {via}) for {inject.WARMUP} "
        f"warm-up steps and {seconds:g} s of steps, then disarmed: the same probe and rules as a doctor run, "
        "without a restart"
    )
