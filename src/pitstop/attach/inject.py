"""Inside the job: what the script that ``pitstop attach`` hands to ``sys.remote_exec`` (PEP 768, Python >= 3.14)
calls. The script (``attach.remote.script_text``) runs between two bytecodes of the job's main thread, imports
this module and calls :func:`arm` or :func:`disarm` with the plan pitstop wrote into it.

``arm`` installs pitstop's own probe (``probe.Probe``: the global optimizer-step and module hooks, the
DataLoader patch, the samplers: the same one ``pitstop.watch`` installs) for one window: ``warmup`` steps, then
``seconds`` of steps (at most ``steps``). At the window's end the probe removes itself (``Probe.finish``) and
its RankProfile is written, whole or not at all, to the file pitstop named. ``disarm`` removes it at once.

Nothing here may raise into the job or leave it changed:

* every entry point catches what goes wrong and writes it to a status file pitstop reads;
* a watchdog (a daemon timer) disarms at ``expires_at`` if the window never completes (the job stopped
  stepping, pitstop died): the job is never left with the probe in it;
* a script that runs after ``arm_by`` (the main thread was blocked in C code until pitstop had given up)
  arms nothing;
* disarming restores every patch, drops the folder the script added to ``sys.path`` and, where the job had
  not imported pitstop itself, forgets pitstop's modules again.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

MID_FORWARD = "a forward is under way: armed between two forwards instead"
_MODULE_CALLS = ("_call_impl", "_wrapped_call_impl")
_MODULE_FILE = os.path.join("torch", "nn", "modules", "module.py")
WARMUP = 2  # a job hours in is warm: the first step after arming is partial, the second settles the hooks
NOT_TRAINING = "this process has not imported torch: it is not a training process (nothing armed)"
LATE = "the script ran after pitstop had stopped waiting for it (the main thread was busy in C code)"
STEPS_CAP = 2000  # the most steps one window keeps, whatever its seconds


@dataclass
class Armed:
    token: str
    probe: Any
    plan: dict[str, Any]
    timer: threading.Timer
    added_path: str | None  # the folder the script appended to sys.path to import pitstop
    had_pitstop: bool  # the job had imported pitstop itself before the script ran


_armed: Armed | None = None
_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) inherits the armed probe: its hooks would run there, measuring
    the worker's own calls into a window that is the parent's. Turned off in the child at once: the hooks
    pass through and the patches are restored; no lock (another thread may have held it at the fork), no
    collector's thread (none exists in the child), nothing written."""
    global _armed
    armed, _armed = _armed, None
    if armed is None:
        return
    with contextlib.suppress(Exception):
        armed.probe.hooks.active = False
        armed.probe.disabled = armed.probe.finished = True
        armed.probe.hooks.remove()


if hasattr(os, "register_at_fork"):  # once per import; a later import's registration finds nothing armed
    os.register_at_fork(after_in_child=_after_fork_in_child)


def status_path(folder: Path | str, kind: str, pid: int) -> Path:
    return Path(folder) / f"{kind}-{pid}.json"


def profile_path(folder: Path | str, pid: int) -> Path:
    return Path(folder) / f"profile-{pid}.json"


def _say(plan: dict[str, Any], kind: str, **payload: Any) -> None:
    """One status file for pitstop (armed / refused / error / disarmed), written whole; a write that fails
    is lost, never raised."""
    with contextlib.suppress(Exception):
        from pitstop.atomic import write_atomic

        text = json.dumps({"pid": os.getpid(), "token": plan.get("token"), "t": time.time(), **payload})
        write_atomic(status_path(plan["dir"], kind, os.getpid()), text)


def arm(plan: dict[str, Any], added_path: str | None = None, had_pitstop: bool = True) -> bool:
    """Install the probe for one window; False (and a status file saying why) when it was not armed."""
    global _armed
    try:
        reason = _refusal(plan)
        if reason is None:
            with _lock:
                if _armed is not None:
                    reason = f"another pitstop attach (token {_armed.token}) is armed in this process"
                else:
                    _armed = _install(plan, added_path, had_pitstop)
        if reason == MID_FORWARD:
            _say(plan, "later", reason=reason)  # pitstop sends the script again a moment later
            _forget(added_path, had_pitstop)
            return False
        if reason is not None:
            _say(plan, "refused", reason=reason, not_training=reason == NOT_TRAINING, late=reason == LATE)
            _forget(added_path, had_pitstop)
            return False
        torch = sys.modules["torch"]
        _say(plan, "armed", python=sys.version.split()[0], torch=getattr(torch, "__version__", None))
        return True
    except Exception as exc:  # never into the job: said, and whatever was installed removed
        _say(plan, "error", error=f"{type(exc).__name__}: {exc}")
        if _armed is not None and _armed.token == plan.get("token"):
            disarm(plan, added_path, had_pitstop)
        else:
            _forget(added_path, had_pitstop)
        return False


def _refusal(plan: dict[str, Any]) -> str | None:
    if time.time() > float(plan["arm_by"]):
        return LATE
    if "torch" not in sys.modules:
        return NOT_TRAINING
    if inside_forward():
        return MID_FORWARD
    return None


def inside_forward(depth: int = 256) -> bool:
    """Whether a thread is inside an ``nn.Module`` call now. The probe finds the training model as the first
    module called outside any other: armed in the middle of a forward it would take a submodule for the
    model, so the arm waits for a moment between forwards (the loop fetching data, backward's C++, the
    optimizer step)."""
    for top in sys._current_frames().values():
        frame: FrameType | None = top
        level = 0
        while frame is not None and level < depth:
            code = frame.f_code
            if code.co_name in _MODULE_CALLS and code.co_filename.endswith(_MODULE_FILE):
                return True
            frame, level = frame.f_back, level + 1
    return False


def _install(plan: dict[str, Any], added_path: str | None, had_pitstop: bool) -> Armed:
    from pitstop.probe.config import ProbeConfig
    from pitstop.probe.probe import Probe

    steps = int(plan.get("steps") or STEPS_CAP)
    config = ProbeConfig(
        warmup=int(plan.get("warmup", WARMUP)), steps=steps, stop_when_done=False, announce=False
    )
    token = str(plan["token"])
    probe = Probe(config, on_done=lambda profile: _finished(token, profile))
    probe.step_listeners.append(_window_clock(probe, float(plan["seconds"])))
    probe.disable_listeners.append(lambda error: _disabled(token, error))
    timer = threading.Timer(max(0.0, float(plan["expires_at"]) - time.time()), _expire, (token,))
    timer.daemon = True
    timer.name = "pitstop-attach-watchdog"
    armed = Armed(token, probe, plan, timer, added_path, had_pitstop)
    try:
        probe.install()
        for loader in loaders_on_stacks():  # the epoch's iterator was made before the probe: its loader
            probe.timeline.know_loader(loader)
    except BaseException:
        _halt(probe)
        raise
    timer.start()
    return armed


def loaders_on_stacks(depth: int = 64) -> list[Any]:
    """The DataLoaders held in the local variables of every thread's frames (the training loop's ``loader``,
    a Trainer's ``train_dataloader``), innermost first; read only."""
    from torch.utils.data import DataLoader

    found: dict[int, Any] = {}
    for top in sys._current_frames().values():
        frame: FrameType | None = top
        level = 0
        while frame is not None and level < depth:
            with contextlib.suppress(Exception):
                for value in list(frame.f_locals.values()):
                    if isinstance(value, DataLoader):
                        found.setdefault(id(value), value)
            frame, level = frame.f_back, level + 1
    return list(found.values())


def _window_clock(probe: Any, seconds: float) -> Any:
    """After each step (on the training thread): once ``seconds`` have been measured, the window ends with
    this step (the probe finishes when its measured steps reach ``config.steps``)."""

    def check() -> None:
        start = probe.window_start_t
        if start is None or probe.finished:
            return
        if time.perf_counter() - probe.origin - start >= seconds:
            probe.config.steps = max(1, len(probe.measured_steps()))

    return check


def _finished(token: str, profile: Any) -> None:
    """The probe's window closed (it has already removed its hooks): its RankProfile to the named file, whole;
    then the watchdog is cancelled and what the script added is dropped."""
    global _armed
    from pitstop.atomic import write_atomic
    from pitstop.core.profile import to_jsonable

    armed = _armed
    if armed is None or armed.token != token:
        return
    try:
        write_atomic(profile_path(armed.plan["dir"], os.getpid()), json.dumps(to_jsonable(profile)))
    except Exception as exc:
        _say(armed.plan, "error", error=f"writing the profile: {type(exc).__name__}: {exc}")
    with _lock:
        _armed = None
    _stop(armed.timer)
    _forget(armed.added_path, armed.had_pitstop)


def _disabled(token: str, error: str) -> None:
    """The probe disabled itself after an internal error (its hooks already removed): pitstop is told at
    once, in the error file, instead of waiting for a profile until the deadline; the arm is cleared."""
    global _armed
    armed = _armed
    if armed is None or armed.token != token:
        return
    _say(armed.plan, "error", error=f"the probe disabled itself after an internal error: {error}")
    with _lock:
        _armed = None
    _stop(armed.timer)
    _halt(armed.probe)  # whatever disable left (it removes hooks and collectors; this is idempotent)
    _forget(armed.added_path, armed.had_pitstop)


def _expire(token: str) -> None:
    """The watchdog: the window did not complete in time; the probe is removed without a profile."""
    armed = _armed
    if armed is not None and armed.token == token:
        _say(armed.plan, "error", error="the window did not complete before its deadline: disarmed")
        disarm(armed.plan, armed.added_path, armed.had_pitstop)


def disarm(plan: dict[str, Any], added_path: str | None = None, had_pitstop: bool = True) -> bool:
    """Remove this session's probe now (idempotent: a window that already closed removed it itself). Says
    ``disarmed`` either way, so pitstop knows the job ran the call; True when a probe was removed here."""
    global _armed
    removed = False
    try:
        with _lock:
            armed = _armed if _armed is not None and _armed.token == plan.get("token") else None
            if armed is not None:
                _armed = None
        if armed is not None:
            _stop(armed.timer)
            if not armed.probe.finished:
                _halt(armed.probe)
                removed = True
            added_path = added_path or armed.added_path
            had_pitstop = had_pitstop and armed.had_pitstop
    finally:
        _say(plan, "disarmed", removed=removed)
        _forget(added_path, had_pitstop)
    return removed


def _stop(timer: threading.Timer) -> None:
    """Cancel the watchdog and let its thread end (at once: it waits on the event cancel sets)."""
    timer.cancel()
    if timer is not threading.current_thread() and timer.is_alive():
        timer.join(timeout=1.0)


def _halt(probe: Any) -> None:
    """Every patch and every collector's thread of a probe whose window did not close, removed."""
    probe.hooks.active = False  # first: every wrapper passes straight through from here on
    probe.disabled = probe.finished = True
    probe.hooks.remove()
    for collector in probe.collectors:
        with contextlib.suppress(Exception):
            collector.stop_window()
        with contextlib.suppress(Exception):
            collector.remove()


def _forget(added_path: str | None, had_pitstop: bool, prefix: str = "pitstop") -> None:
    """Undo what the script did to import pitstop: its folder off sys.path, pitstop's modules out of
    sys.modules when the job had not imported pitstop itself (no trace left for the job's own imports)."""
    if added_path is not None:
        with contextlib.suppress(ValueError):
            sys.path.remove(added_path)
    if not had_pitstop:
        for name in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
            sys.modules.pop(name, None)
