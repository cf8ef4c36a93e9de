"""Start the user's command unchanged, with the probe injected into every Python process it starts.

Injection is ``runner.inject``'s. The command runs in its own process
group; Ctrl-C (and SIGTERM / SIGHUP to pitstop) is forwarded to the group as SIGINT, escalating to
SIGTERM and SIGKILL for a job that ignores it, and whatever is left of the group when the command ends is
cleaned up. Should pitstop itself die without a chance to clean up (SIGKILL), a small reaper process that
holds a pipe from pitstop ends the group when the pipe closes, and the job's top Python process carries a
parent-death signal (``probe.bootstrap``): no training process outlives pitstop.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pitstop.errors import PitstopError
from pitstop.probe.config import ENV_RUNNER_PID, ProbeConfig
from pitstop.runner.inject import child_environment, prepare_injection

GRACE_S = 10.0


@dataclass
class Launch:
    command: list[str]
    out_dir: Path
    exit_code: int | None = None  # as Popen reports it: -N when the command's top process died by signal N
    interrupted: bool = False  # pitstop stopped the command (Ctrl-C, a signal to pitstop, the timeout)
    stopped_by: str | None = None  # why pitstop stopped it: "SIGINT", "SIGTERM", "SIGHUP" or "timeout"
    forced: bool = False  # it did not end on SIGINT (and SIGTERM) and had to be killed with SIGKILL
    start_error: str | None = None
    log_path: Path | None = None
    seconds: float = 0.0


class CommandError(PitstopError):
    """The command could not be started at all."""


class _Terminated(KeyboardInterrupt):
    """pitstop itself got SIGTERM / SIGHUP: stop the command's group the way Ctrl-C does."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated(signum)


@contextlib.contextmanager
def _terminate_like_interrupt() -> Iterator[None]:
    """While the command runs, SIGTERM and SIGHUP to pitstop end the command's process group too."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise_terminated) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def resolve(command: list[str]) -> str:
    if not command:
        raise CommandError("no command given: put it after `--`, e.g. pitstop doctor -- python train.py")
    exe = command[0]
    if os.sep in exe:
        if not os.path.exists(exe):
            raise CommandError(f"cannot start `{exe}`: no such file")
        if not os.access(exe, os.X_OK):
            raise CommandError(f"cannot start `{exe}`: not executable (try `python {exe}`)")
        return exe
    found = shutil.which(exe)
    if found is None:
        raise CommandError(f"cannot start `{exe}`: command not found")
    return found


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _end_group(pgid: int, first: int = signal.SIGTERM, grace_s: float = 3.0) -> bool:
    """Ask the rest of the group to go, then make it. Returns whether SIGKILL was needed."""
    if not _group_alive(pgid):
        return False
    _signal_group(pgid, first)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.05)
    if not _group_alive(pgid):
        return False
    _signal_group(pgid, signal.SIGKILL)
    return True


# The reaper: a tiny interpreter in its own session that waits for EOF on a pipe from pitstop. pitstop writes
# "done" before closing it; an EOF without it means pitstop died, and the reaper ends the command's group.
_REAPER = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
pgid = int(sys.argv[1])
if sys.stdin.buffer.read() == b"done":
    sys.exit(0)
def alive():
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False
if alive():
    try:
        os.killpg(pgid, signal.SIGTERM)
    except OSError:
        pass
    end = time.monotonic() + 3.0
    while time.monotonic() < end and alive():
        time.sleep(0.05)
    if alive():
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
"""


class _Reaper:
    """Ends the command's process group if pitstop dies without ending it (SIGKILL gives no chance)."""

    def __init__(self, pgid: int) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-S", "-c", _REAPER, str(pgid)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C or a kill of pitstop's group does not reach it
                close_fds=True,
            )
        except OSError:
            self.proc = None  # the parent-death signal in the job still covers its top process

    def release(self) -> None:
        """The group has been ended by pitstop: let the reaper go without doing anything."""
        if self.proc is None or self.proc.stdin is None:
            return
        with contextlib.suppress(OSError):
            self.proc.stdin.write(b"done")
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


def run_observed(
    command: list[str],
    config: ProbeConfig,
    quiet: bool = False,
    on_tick: Callable[[Path], None] | None = None,
    out_dir: Path | None = None,
    timeout_s: float | None = None,
    extra_env: dict[str, str] | None = None,
) -> Launch:
    """Run ``command`` under the probe and wait for it. Never raises for the command's own failures.
    ``extra_env`` is added to the command's environment (`pitstop tune` passes its fix requests so)."""
    out = out_dir or Path(tempfile.mkdtemp(prefix="pitstop-"))
    out.mkdir(parents=True, exist_ok=True)
    config.out_dir = out
    launch = Launch(command=list(command), out_dir=out)
    try:
        resolve(command)
    except CommandError as exc:
        launch.start_error = str(exc)
        return launch
    env = child_environment(config, prepare_injection(out))
    env.update(extra_env or {})
    env[ENV_RUNNER_PID] = str(os.getpid())  # the job's top process asks to die with pitstop
    log = None
    if quiet:
        launch.log_path = out / "command.log"
        log = launch.log_path.open("wb")
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            command, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT if log else None
        )
    except OSError as exc:
        launch.start_error = f"cannot start `{command[0]}`: {exc.strerror or exc}"
        if log:
            log.close()
        return launch
    pgid = proc.pid
    reaper = _Reaper(pgid)
    try:
        with _terminate_like_interrupt():
            _wait(proc, pgid, launch, started, on_tick, out, timeout_s)
    finally:
        _end_group(pgid)  # DataLoader workers, torchrun children: nothing outlives pitstop
        reaper.release()
        if log:
            log.close()
        launch.seconds = time.monotonic() - started
    return launch


def _wait(
    proc: subprocess.Popen[bytes],
    pgid: int,
    launch: Launch,
    started: float,
    on_tick: Callable[[Path], None] | None,
    out: Path,
    timeout_s: float | None,
) -> None:
    try:
        while True:
            try:
                launch.exit_code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if on_tick is not None:
                    on_tick(out)
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    launch.interrupted = True
                    launch.stopped_by = "timeout"
                    launch.forced = _end_group(pgid, signal.SIGINT, GRACE_S)
                    launch.exit_code = proc.wait()
                    break
    except KeyboardInterrupt as exc:
        launch.interrupted = True
        launch.stopped_by = signal.Signals(exc.signum).name if isinstance(exc, _Terminated) else "SIGINT"
        _signal_group(pgid, signal.SIGINT)
        try:
            launch.exit_code = proc.wait(timeout=GRACE_S)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            launch.forced = _end_group(pgid, signal.SIGTERM)
            launch.exit_code = proc.wait()
