"""Start the user's command unchanged, with the probe injected into every Python process it starts.

Injection is ``runner.inject``'s. The command leads its own process group in pitstop's session, as a shell
starts a job, so it behaves as it does without pitstop: it may ``os.setpgid(0, 0)``, its children may
``setsid()``, daemonize or move to groups of their own. pitstop is their subreaper, so those stay its
descendants and are ended with the rest.

The job ends the way a terminal ends it: Ctrl-C (and SIGTERM / SIGHUP to pitstop) is forwarded to the group
as SIGINT, escalating to SIGTERM and SIGKILL for a job that ignores it, and once every rank has written its
window (``probe.ending``) pitstop sends the same SIGINT, so the job's ``finally:`` and ``atexit`` handlers
run. Whatever is left of the job when its top process ends is cleaned up. Should pitstop itself die without
a chance to clean up (SIGKILL), the job's top process gets SIGINT as its parent-death signal
(``probe.bootstrap``), and a small reaper process that holds a pipe from pitstop ends the group and every
process that left it after a grace period: no training process outlives pitstop.

The job's output reaches the terminal through a relay (``runner.relay``) that keeps all of it in a log file:
once pitstop decides to stop the job (its window is written, its probe is lost, its --timeout is up), nothing
more of it is shown, so the traceback the stop causes is in the log and not on the terminal
(``Launch.output_cut``). A quiet run writes to the log file directly, as it always did.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pitstop.errors import PitstopError
from pitstop.interrupts import terminate_as_interrupt
from pitstop.probe.config import ENV_RUNNER_PID, ProbeConfig
from pitstop.probe.ending import ProbeLost, lost_probes, window_written
from pitstop.runner.inject import blind_spot, child_environment, prepare_injection
from pitstop.runner.nccl import nccl_log_env, visible_gpus
from pitstop.runner.relay import Relay

if TYPE_CHECKING:
    import psutil

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
    # pitstop stopped the job like Ctrl-C once every rank had written its window (the normal end of a window):
    # exit_code is then 0, the code the interrupted job actually ended with is job_exit_code, and
    # window_forced says whether it took SIGKILL
    ended_after_window: bool = False
    job_exit_code: int | None = None
    window_forced: bool = False
    # the job's whole output: a quiet run's, or the relay's copy of what it showed (None: not kept)
    log_path: Path | None = None
    # bytes of the log shown (or, quiet, written) before pitstop decided to stop the job: what follows is the
    # job's reaction to the stop, kept out of the terminal; None when pitstop did not stop it so
    output_cut: int | None = None
    seconds: float = 0.0
    # a rank's probe disabled itself, so no window would come: pitstop stopped the job as it does after a
    # window (exit_code 0, the job's own in job_exit_code), and says why in one line
    probe_lost: ProbeLost | None = None


class CommandError(PitstopError):
    """The command could not be started at all."""


class BlindSpotError(PitstopError):
    """The command would run where the probe cannot arm (``python -S``; ``-I``/``-E`` without pitstop)."""


class _Terminated(KeyboardInterrupt):
    """pitstop itself got SIGTERM / SIGHUP: stop the command's group the way Ctrl-C does."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


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


# The reaper: a tiny interpreter (no site, so nothing of pitstop's or the job's is imported) in its own session,
# reading lines from a pipe from pitstop: "PID START" for each process of the job that left its group
# (START is /proc's start time in clock ticks, so a reused PID is never taken for it), and "done" once pitstop
# has ended the job itself. An end of the pipe without "done" means pitstop died: the reaper gives the job's
# own Ctrl-C cleanup (the top process got SIGINT as its parent-death signal) a grace period, then ends the
# group and every known process and their descendants with SIGTERM, and SIGKILL for what is left.
_REAPER = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
pgid, grace = int(sys.argv[1]), float(sys.argv[2])
known = {}
for line in sys.stdin.buffer:
    if line.strip() == b"done":
        sys.exit(0)
    pid, _, start = line.decode().partition(" ")
    known[int(pid)] = start.strip()
def stat(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return fields[0], int(fields[1]), int(fields[2]), fields[19]  # state, ppid, pgid, start
def family():
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            seen = stat(int(name))
            if seen is not None and seen[0] != "Z":
                table[int(name)] = seen
    ours = {p for p, s in table.items() if s[2] == pgid or known.get(p) == s[3]}
    grown = True
    while grown:
        more = {p for p, s in table.items() if s[1] in ours} - ours
        ours |= more
        grown = bool(more)
    ours.discard(os.getpid())
    return ours
def send(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
end = time.monotonic() + grace
while time.monotonic() < end and family():
    time.sleep(0.1)
for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 0.0)):
    left = family()
    if not left:
        break
    send(left, sig)
    send(left, signal.SIGCONT)
    end = time.monotonic() + wait
    while time.monotonic() < end and family():
        time.sleep(0.05)
"""


class _Reaper:
    """Ends the job if pitstop dies without ending it (SIGKILL gives no chance): its process group, and the
    processes pitstop told it about that left the group (``tell``), with all their descendants."""

    def __init__(self, pgid: int) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.told: set[tuple[int, str]] = set()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-S", "-c", _REAPER, str(pgid), str(GRACE_S)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C or a kill of pitstop's group does not reach it
                close_fds=True,
            )
        except OSError:
            self.proc = None  # the parent-death signal in the job still covers its top process

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def tell(self, processes: dict[int, str]) -> None:
        """Make sure the reaper knows these processes (PID → start time), should pitstop die."""
        if self.proc is None or self.proc.stdin is None:
            return
        new = set(processes.items()) - self.told
        if not new:
            return
        with contextlib.suppress(OSError):
            self.proc.stdin.write("".join(f"{pid} {start}\n" for pid, start in sorted(new)).encode())
            self.proc.stdin.flush()
            self.told |= new

    def release(self) -> None:
        """pitstop has ended the job itself: let the reaper go without doing anything."""
        if self.proc is None or self.proc.stdin is None:
            return
        with contextlib.suppress(OSError):
            self.proc.stdin.write(b"done\n")
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


PR_SET_CHILD_SUBREAPER = 36
LIST_EVERY_S = 1.0  # how often the reaper hears of the job's processes that left its group
END_GRACE_S = 3.0  # what is left of the job once its top process ended: SIGTERM, then SIGKILL after this


def _subreaper(on: bool) -> bool:
    """Make pitstop the subreaper of the job (Linux): a process of the job whose parent ends comes back to
    pitstop, not to init, so pitstop still sees it as a descendant and can end it. Returns whether it took."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _start_ticks(pid: int) -> str | None:
    """When the process started, in clock ticks since boot (as the reaper reads it), or None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


class _Job:
    """The running command and every process it started, wherever those went.

    The command leads its own process group (``process_group=0``) in pitstop's session, as a shell starts a
    job: it can ``os.setpgid(0, 0)``, its children can ``setsid()`` or move to a group of their own, and a
    daemon can fork away. Those that leave the group are still the job's: pitstop is their subreaper, so
    they stay its descendants after their own parents end; it ends them with the rest, and tells the reaper
    about them (PID and start time), should it die before it can.
    """

    def __init__(self, proc: subprocess.Popen[bytes], subreaper: bool, not_ours: set[int]) -> None:
        self.proc = proc
        self.pgid = proc.pid
        self.subreaper = subreaper
        self.not_ours = not_ours  # pitstop's own children from before the command (and the reaper)
        self.reaper = _Reaper(self.pgid)
        # called before pitstop's own stop: the job's output from then on goes to the log alone
        self.hold_output: Callable[[], None] = _nothing_to_hold
        if self.reaper.pid is not None:
            self.not_ours.add(self.reaper.pid)
        self._listed = 0.0

    def processes(self) -> list[psutil.Process]:
        """The job's processes still there (zombies included: waiting on them reaps them)."""
        import psutil

        with contextlib.suppress(psutil.Error):
            return [p for p in psutil.Process().children(recursive=True) if p.pid not in self.not_ours]
        return []

    def tell_reaper(self) -> None:
        """Once a second: the processes that left the group, for the reaper."""
        now = time.monotonic()
        if now - self._listed < LIST_EVERY_S:
            return
        self._listed = now
        left: dict[int, str] = {}
        for process in self.processes():
            with contextlib.suppress(OSError):
                start = _start_ticks(process.pid)
                if start is not None and os.getpgid(process.pid) != self.pgid:
                    left[process.pid] = start
        self.reaper.tell(left)

    def signal_group(self, sig: int) -> None:
        """As a terminal's Ctrl-C does: to the command's process group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)

    def stop(self, signals: tuple[tuple[int, float], ...]) -> bool:
        """Send the group each signal in turn until the command's top process ends, waiting as long as each
        says. Returns whether it took SIGKILL."""
        for sig, wait in signals:
            if self.proc.poll() is not None:
                return False
            self.signal_group(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=wait)
        return self.proc.poll() is None and self._kill_top()

    def _kill_top(self) -> bool:
        self.signal_group(signal.SIGKILL)
        self.proc.wait()
        return True

    def end_the_rest(self) -> None:
        """Nothing outlives pitstop: what is left of the job (DataLoader workers, torchrun's children, a
        server it started in a session of its own) gets SIGTERM, then SIGKILL; those that are pitstop's
        children by now are reaped."""
        import psutil

        for sig in (signal.SIGTERM, signal.SIGKILL):
            left = self.processes()
            self.signal_group(sig)
            for process in left:
                with contextlib.suppress(psutil.Error):
                    process.send_signal(sig)
                    process.send_signal(signal.SIGCONT)  # a stopped process handles its SIGTERM
            _, alive = psutil.wait_procs(left, timeout=END_GRACE_S)
            if not alive and not self.processes():
                break
        if self.subreaper:
            _subreaper(False)
        self.reaper.release()


def run_observed(
    command: list[str],
    config: ProbeConfig,
    quiet: bool = False,
    on_tick: Callable[[Path], None] | None = None,
    out_dir: Path | None = None,
    timeout_s: float | None = None,
    extra_env: dict[str, str] | None = None,
    output_log: Path | None = None,
) -> Launch:
    """Run ``command`` under the probe and wait for it. Never raises for the command's own failures; raises
    ``BlindSpotError`` (one line, exit 2), before starting anything, for a command pitstop cannot see inside.
    ``extra_env`` is added to the command's environment (`pitstop tune` passes its fix requests so).
    ``output_log``: where the job's whole output is kept (default: ``command.log`` in the run folder); quiet,
    it goes there alone, otherwise it is also shown until pitstop stops the job."""
    out = out_dir or Path(tempfile.mkdtemp(prefix="pitstop-"))
    out.mkdir(parents=True, exist_ok=True)
    config.out_dir = out
    launch = Launch(command=list(command), out_dir=out)
    try:
        resolve(command)
    except CommandError as exc:
        launch.start_error = str(exc)
        return launch
    blind = blind_spot(command)  # doctor, watch and tune alike: `python -S` would run unobserved
    if blind is not None:
        raise BlindSpotError(blind)
    env = child_environment(config, prepare_injection(out))
    env.update(extra_env or {})
    env.update(nccl_log_env(env, out, visible_gpus(env)))  # NCCL's init to a file of ours, on GPUs
    env[ENV_RUNNER_PID] = str(os.getpid())  # the job's top process asks to die with pitstop
    launch.log_path = output_log or out / "command.log"
    log = None
    relay = None
    if quiet:
        log = launch.log_path.open("wb")
    else:
        relay = Relay.start(launch.log_path, out)  # None: pitstop has no stdout / stderr to show it on
    outputs: dict[str, Any] = {"stdout": log, "stderr": subprocess.STDOUT if log else None}
    if relay is not None:
        outputs = {"stdout": relay.stdout, "stderr": relay.stderr}
    elif not quiet:
        launch.log_path = None  # the job writes to pitstop's own streams: no copy
    started = time.monotonic()
    subreaper = _subreaper(True)
    not_ours = _children()
    if relay is not None:
        not_ours.add(relay.proc.pid)
    try:
        proc = subprocess.Popen(command, env=env, **outputs, **_OWN_GROUP)
    except OSError as exc:
        launch.start_error = f"cannot start `{command[0]}`: {exc.strerror or exc}"
        if log:
            log.close()
        if relay is not None:
            relay.finish()
        if subreaper:
            _subreaper(False)
        return launch
    if relay is not None:
        relay.job_started()
    job = _Job(proc, subreaper, not_ours)
    job.hold_output = lambda: _hold_output(launch, log, relay)
    try:
        with terminate_as_interrupt(_Terminated):  # the command's process group ends with pitstop
            _wait(job, launch, started, on_tick, out, timeout_s)
    finally:
        job.end_the_rest()
        if log:
            log.close()
        if relay is not None:
            relay.finish()
        launch.seconds = time.monotonic() - started
    return launch


def _nothing_to_hold() -> None:
    return None


def _hold_output(launch: Launch, log: Any, relay: Relay | None) -> None:
    """pitstop is about to stop the job: what it writes from now on stays in the log (``output_cut``)."""
    if launch.output_cut is not None or launch.log_path is None:
        return
    if relay is not None:
        launch.output_cut = relay.stop_showing()
    elif log is not None:
        with contextlib.suppress(OSError, ValueError):
            log.flush()
            launch.output_cut = os.fstat(log.fileno()).st_size


def _lead_own_group() -> None:
    os.setpgid(0, 0)


# the command leads a process group of its own, in pitstop's session (Python 3.10 has no process_group)
_OWN_GROUP: dict[str, Any] = (
    {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": _lead_own_group}
)


def _children() -> set[int]:
    import psutil

    with contextlib.suppress(psutil.Error):
        return {p.pid for p in psutil.Process().children()}
    return set()


# Ctrl-C, as a terminal's: SIGINT, then SIGTERM and SIGKILL for a job that does not end on it
_LIKE_CTRL_C = ((signal.SIGINT, GRACE_S), (signal.SIGTERM, END_GRACE_S))


def _wait(
    job: _Job,
    launch: Launch,
    started: float,
    on_tick: Callable[[Path], None] | None,
    out: Path,
    timeout_s: float | None,
) -> None:
    proc = job.proc
    try:
        while True:
            try:
                launch.exit_code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                job.tell_reaper()
                if on_tick is not None:
                    on_tick(out)
                if window_written(out):
                    _end_after_window(job, launch)
                    break
                lost = lost_probes(out)
                if lost is not None:
                    launch.probe_lost = lost
                    _end_after_window(job, launch)  # stopped the same way; no window was written
                    launch.ended_after_window = False
                    break
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    job.hold_output()
                    launch.interrupted = True
                    launch.stopped_by = "timeout"
                    launch.forced = job.stop(((signal.SIGINT, GRACE_S),))
                    launch.exit_code = proc.wait()
                    break
    except KeyboardInterrupt as exc:
        launch.interrupted = True
        launch.stopped_by = signal.Signals(exc.signum).name if isinstance(exc, _Terminated) else "SIGINT"
        job.signal_group(signal.SIGINT)
        try:
            launch.exit_code = proc.wait(timeout=GRACE_S)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):  # a second Ctrl-C does not wait the grace out
            launch.forced = job.stop(_LIKE_CTRL_C[1:])
            launch.exit_code = proc.wait()


def _end_after_window(job: _Job, launch: Launch) -> None:
    """Every rank has written its window: stop the job as the user's Ctrl-C would, so its own ``finally:``
    blocks and ``atexit`` handlers run (ending the servers it started, closing its files). The job did what
    pitstop asked of it, so this is a success whatever code the interrupted job ends with (kept apart)."""
    launch.ended_after_window = True
    job.hold_output()
    signals = _LIKE_CTRL_C[1:] if _ignores_sigint(job.proc.pid) else _LIKE_CTRL_C
    launch.window_forced = job.stop(signals)
    launch.job_exit_code = job.proc.wait()
    launch.exit_code = 0


def _ignores_sigint(pid: int) -> bool:
    """Whether the process ignores SIGINT (it inherited SIG_IGN from a script that started pitstop in the
    background): a Ctrl-C cannot stop it, so waiting out the grace would only delay the end."""
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False
