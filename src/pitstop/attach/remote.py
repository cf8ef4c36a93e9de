"""The full probe in a running job, by ``sys.remote_exec`` (PEP 768, Python >= 3.14): whether it can be used
for a PID (and if not, which reason), the script it runs in the job, and one window: arm, wait for the
RankProfile the job writes, disarm in a ``finally``.

Which interpreter makes the call: ``sys.remote_exec`` exists only from 3.14 and the caller must run the
target's major.minor (the exact version for a pre-release). pitstop's own interpreter is used when it
matches; otherwise the job's own executable (``/proc/PID/exe``, the very binary the job runs, run as
``-I -S``: no site, no environment, no job code) makes the call, so pitstop on 3.11 can still arm a 3.14 job.

Why it may not be used, each said in one line and answered by sampling instead: the job runs a Python older
than 3.14; ``PYTHON_DISABLE_REMOTE_DEBUG`` in its start-up environment (ignored by the interpreter under
``-E`` / ``-I``, and so here); ``-X disable_remote_debug`` on its command line; its interpreter was built
without remote debugging (``--without-remote-debug``: ``Py_REMOTE_DEBUG`` 0 in its sysconfig); no
interpreter pitstop can run to make the call; the kernel refused the call (ptrace permission, Yama's
``ptrace_scope``, a container without ``CAP_SYS_PTRACE``); the job never ran the script, or took no step.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.attach import inject, procs

MIN_VERSION = (3, 14)
QUERY = (
    "import sys, sysconfig; print(repr((tuple(sys.version_info[:3]), sys.version_info.releaselevel, "
    "hasattr(sys, 'remote_exec'), sysconfig.get_config_var('Py_REMOTE_DEBUG'))))"
)
CALL = "import sys; sys.remote_exec(int(sys.argv[1]), sys.argv[2])"
ARM_WAIT_S = 15.0  # how long the job's main thread has to reach a bytecode and run the script
GRACE_S = 60.0  # beyond the window: the warm-up steps, a slow step that ends the window, writing the file


class RemoteFailed(Exception):
    """The remote-exec window did not give a profile; the message says why, in one line."""


@dataclass(frozen=True)
class Interpreter:
    """What the job's executable says of itself (asked by running it with ``-I -S -c``)."""

    version: tuple[int, int, int]
    final: bool  # a release, not an alpha / beta / candidate
    has_remote_exec: bool
    remote_debug_built: int | None  # sysconfig's Py_REMOTE_DEBUG: 1, 0 (built without), None (not said)


@dataclass
class Decision:
    """Whether the full probe can be armed in these PIDs; ``caller`` is the interpreter command that makes
    the ``sys.remote_exec`` call, ``reason`` why not (None when it can)."""

    pids: list[int]
    caller: list[str] | None = None
    reason: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.reason is None and self.caller is not None


def _version_text(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def libpython_version(pid: int, proc: Path = procs.PROC) -> tuple[int, int] | None:
    """The X.Y of a libpythonX.Y the process has mapped (an interpreter built shared, or embedded)."""
    try:
        text = (proc / str(pid) / "maps").read_text(errors="replace")
    except OSError:
        return None
    match = re.search(r"libpython(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def executable(pid: int, proc: Path = procs.PROC) -> Path | None:
    """The binary the process runs (the link's target; a replaced binary reads '... (deleted)')."""
    try:
        return Path(os.readlink(proc / str(pid) / "exe"))
    except OSError:
        return None


def looks_like_python(path: Path | None) -> bool:
    """python, python3, python3.14, python3.14t, python3.14d: a CPython binary pitstop may run with -I -S.
    Anything else (an application embedding libpython) is never run with Python's options."""
    if path is None:
        return False
    name = path.name.removesuffix(" (deleted)")
    return re.fullmatch(r"python(\d+(\.\d+)?[a-z]*)?", name) is not None


def untrusted_binary(pid: int, proc: Path = procs.PROC) -> str | None:
    """Why pitstop, as root, must not run the job's executable (None when it may, or pitstop is not root).

    Root running a binary its owner can rewrite (or swap: a folder above it writable by them) would hand
    that user root: the binary, and every folder above its path, must be root's and written by no group or
    other. A binary since replaced or deleted on disk is not run either (its path no longer names it)."""
    if os.geteuid() != 0:
        return None
    link = proc / str(pid) / "exe"
    try:
        path = Path(os.readlink(link))
        st = os.stat(link)
        on_disk = os.stat(path)
    except OSError as exc:
        return f"its executable could not be checked ({exc.strerror or exc})"
    if (st.st_dev, st.st_ino) != (on_disk.st_dev, on_disk.st_ino):
        return f"its executable {path} was replaced on disk since the job started"
    for part in (path, *path.parents):
        try:
            info = st if part == path else os.stat(part)
        except OSError as exc:
            return f"{part} could not be checked ({exc.strerror or exc})"
        if info.st_uid != 0:
            return f"{part} is owned by uid {info.st_uid}, not root"
        if info.st_mode & 0o022:
            return f"{part} is writable by its group or others (mode {info.st_mode & 0o7777:o})"
    return None


def name_version(path: Path | None) -> tuple[int, int] | None:
    """The X.Y a binary's name says (python3.14, python3.14t), for a binary pitstop will not run."""
    if path is None:
        return None
    match = re.fullmatch(r"python(\d+)\.(\d+)[a-z]*", path.name.removesuffix(" (deleted)"))
    return (int(match.group(1)), int(match.group(2))) if match else None


def ask(command: list[str]) -> Interpreter | None:
    """Run ``command -c QUERY`` (an interpreter with -I -S) and read what it says of itself."""
    try:
        done = subprocess.run([*command, "-c", QUERY], capture_output=True, text=True, timeout=20)
        version, level, has, built = ast.literal_eval(done.stdout.strip())
        return Interpreter(tuple(version), level == "final", bool(has), built)
    except (OSError, subprocess.SubprocessError, ValueError, SyntaxError, TypeError):
        return None


def interpreter_options(cmdline: list[str]) -> tuple[set[str], list[str]]:
    """The interpreter's own flags (single letters) and its -X options, from a Python command line: the
    options before the script, ``-c`` or ``-m`` (long options skipped, with the value one of them takes)."""
    flags: set[str] = set()
    xopts: list[str] = []
    args = cmdline[1:]
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-") or arg in ("-", "--"):
            break
        if arg.startswith("--"):  # --check-hash-based-pycs MODE takes a value; the others (--version) none
            i += 2 if arg == "--check-hash-based-pycs" else 1
            continue
        letters = arg[1:]
        for j, letter in enumerate(letters):
            if letter in "XW":
                value = letters[j + 1 :] or (args[i + 1] if i + 1 < len(args) else "")
                i += 0 if letters[j + 1 :] else 1
                if letter == "X":
                    xopts.append(value)
                break
            flags.add(letter)
            if letter in "cm":
                return flags, xopts
        i += 1
    return flags, xopts


def disabled_by_job(pid: int, proc: Path = procs.PROC) -> str | None:
    """The job's own switches that turn remote debugging off: its start-up environment and its command line."""
    cmdline = procs.cmdline(pid) if proc == procs.PROC else _cmdline(proc, pid)
    flags, xopts = interpreter_options(cmdline)
    env = _environ(proc, pid, "PYTHON_DISABLE_REMOTE_DEBUG")
    value = env.get("PYTHON_DISABLE_REMOTE_DEBUG")
    if value and not flags & {"E", "I"}:  # -E / -I: the interpreter ignored PYTHON* variables at start-up
        return (
            f"PYTHON_DISABLE_REMOTE_DEBUG={value} is set in PID {pid}'s environment: remote debugging is off"
        )
    if any(x.split("=", 1)[0] == "disable_remote_debug" for x in xopts):
        return f"PID {pid} was started with -X disable_remote_debug: remote debugging is off"
    return None


def _cmdline(proc: Path, pid: int) -> list[str]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _environ(proc: Path, pid: int, *names: str) -> dict[str, str]:
    if proc == procs.PROC:
        return procs.environ(pid, *names)
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode(errors="replace") for k, v in pairs if k.decode() in names}


def other_mount_namespace(pid: int, proc: Path = procs.PROC) -> str | None:
    """Why the job cannot read pitstop's script folder: it sees another filesystem (a container, systemd's
    PrivateTmp), so the path handed to sys.remote_exec names nothing there, or another file. None when
    both share one mount namespace, or either link cannot be read (the call then says what it finds)."""
    try:
        own = os.readlink(proc / "self" / "ns" / "mnt")
        theirs = os.readlink(proc / str(pid) / "ns" / "mnt")
    except OSError:
        return None
    if own == theirs:
        return None
    return (
        f"PID {pid} runs in another mount namespace ({theirs}, pitstop's is {own}: a container or a private "
        "/tmp): it cannot read the script pitstop writes"
    )


def rank_pids(pid: int, proc: Path = procs.PROC) -> list[int]:
    """The processes to arm: the ranks below a launcher (the topmost processes with RANK in their
    environment; their DataLoader workers inherit it from them), else the topmost Python processes of the
    tree (the PID itself, or a shell script's python), else the PID itself. A process among them that never
    imported torch refuses the arm and is left out (``probed``)."""
    tree = [pid, *procs.descendants(pid)]
    ranked = [p for p in tree if "RANK" in procs.environ(p, "RANK")]
    if not ranked:
        ranked = [p for p in tree if looks_like_python(executable(p, proc)) or libpython_version(p, proc)]
    tops = sorted(p for p in ranked if p == pid or procs.parent(p) not in ranked)
    return tops or [pid]


Asker = Callable[[list[str]], Interpreter | None]


def decide_one(pid: int, proc: Path = procs.PROC, asker: Asker = ask) -> tuple[list[str] | None, str | None]:
    """(the caller command, None) when the full probe can be armed in ``pid``, else (None, the reason)."""
    exe = executable(pid, proc)
    distrust = untrusted_binary(pid, proc) if looks_like_python(exe) else None
    runnable = looks_like_python(exe) and distrust is None
    exe_cmd = [str(proc / str(pid) / "exe"), "-I", "-S"]  # the job's binary, even one replaced on disk
    facts = asker(exe_cmd) if runnable else None
    version = facts.version[:2] if facts is not None else libpython_version(pid, proc)
    if version is None and distrust is not None:
        version = name_version(exe)
    if version is None and distrust is not None:
        return None, f"pitstop runs as root and will not run PID {pid}'s executable: {distrust}"
    if version is None:
        return None, f"could not tell which Python PID {pid} runs ({exe or 'no executable readable'})"
    if version < MIN_VERSION:
        shown = _version_text(facts.version if facts is not None else version)
        return (
            None,
            f"PID {pid} runs Python {shown}: sys.remote_exec (PEP 768) needs the job on 3.14 or newer",
        )
    blocked = disabled_by_job(pid, proc) or other_mount_namespace(pid, proc)
    if blocked is not None:
        return None, blocked
    if facts is not None and (facts.remote_debug_built == 0 or not facts.has_remote_exec):
        return None, (
            f"PID {pid}'s Python {_version_text(facts.version)} was built without remote debugging "
            "(--without-remote-debug)"
        )
    own = sys.version_info
    own_final = own.releaselevel == "final"  # a pre-release caller must match the job exactly: never assumed
    if hasattr(sys, "remote_exec") and own[:2] == version and own_final and (facts is None or facts.final):
        return [sys.executable, "-I", "-S"], None
    if facts is not None:
        return exe_cmd, None
    if distrust is not None:
        return None, (
            f"pitstop runs as root and will not run PID {pid}'s executable to make the call: {distrust} "
            f"(its user could make it run their code as root); pitstop's own Python {own.major}.{own.minor} "
            "cannot make the call itself"
        )
    return None, (
        f"pitstop runs on Python {own.major}.{own.minor} (sys.remote_exec exists only from 3.14) and PID "
        f"{pid}'s executable ({exe}) is not a python interpreter pitstop can run to make the call"
    )


def decide(pid: int, asker: Asker = ask) -> Decision:
    """The ranks to arm and how, or the first reason one of them cannot be armed."""
    pids = rank_pids(pid)
    decision = Decision(pids)
    for p in pids:
        caller, reason = decide_one(p, asker=asker)
        if reason is not None:
            decision.reason, decision.caller = reason, None
            return decision
        decision.caller = decision.caller or caller
    return decision


SCRIPT = """\
# Written by pitstop attach ({action}) for PID {pid}. sys.remote_exec (PEP 768) runs it between two
# bytecodes of the job's main thread; it imports pitstop.attach.inject and calls {action}(plan). It never
# raises into the job: what goes wrong is written to error-PID.json in the plan's folder.
def _pitstop_attach():
    import sys
    plan = {plan!r}
    had = "pitstop" in sys.modules
    added = None
    try:
        try:
            from pitstop.attach import inject
        except ImportError:
            sys.path.append(plan["pitstop_path"])
            added = plan["pitstop_path"]
            from pitstop.attach import inject
        inject.{action}(plan, added, had)
    except Exception as exc:
        if added is not None and added in sys.path:
            sys.path.remove(added)
        try:
            import json
            import os
            path = os.path.join(plan["dir"], "error-%d.json" % os.getpid())
            with open(path + ".partial", "w") as f:
                json.dump({{"pid": os.getpid(), "error": "%s: %s" % (type(exc).__name__, exc)}}, f)
            os.replace(path + ".partial", path)
        except OSError:
            pass


_pitstop_attach()
del _pitstop_attach
"""


def pitstop_path(folder: Path) -> str:
    """A folder holding only a link to the pitstop package, made in the window's ``folder``: appended, last,
    to the job's sys.path only if the job cannot import pitstop itself. Never the folder above the package
    (a non-editable install's site-packages: every package pitstop's environment holds would become
    importable in the job, shadowing none but answering any import the job's own environment lacks)."""
    package = Path(__file__).resolve().parents[1]  # .../pitstop/attach/remote.py -> .../pitstop
    only = folder / "import"
    only.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        (only / "pitstop").symlink_to(package, target_is_directory=True)
    return str(only)


def script_text(action: str, plan: dict[str, Any], pid: int) -> str:
    if action not in ("arm", "disarm"):
        raise ValueError(action)
    return SCRIPT.format(action=action, plan=plan, pid=pid)


def make_plan(folder: Path, seconds: float, steps: int | None, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    return {
        "token": secrets.token_hex(8),
        "dir": str(folder),
        "pitstop_path": pitstop_path(folder),
        "seconds": float(seconds),
        "steps": steps,
        "warmup": inject.WARMUP,
        "arm_by": now + ARM_WAIT_S,
        "expires_at": now + ARM_WAIT_S + seconds + GRACE_S,
    }


def read_status(folder: Path, kind: str, pid: int) -> dict[str, Any] | None:
    path = inject.status_path(folder, kind, pid)
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else None
    return None


def call(caller: list[str], pid: int, script: Path) -> None:
    """One ``sys.remote_exec(pid, script)``, made by ``caller``; RemoteFailed with the reason."""
    try:
        done = subprocess.run(
            [*caller, "-c", CALL, str(pid), str(script)], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise RemoteFailed(f"could not run {caller[0]} to make the call: {exc}") from None
    if done.returncode != 0:
        raise RemoteFailed(call_error(pid, done.stderr))


def call_error(pid: int, stderr: str) -> str:
    """sys.remote_exec's failure, in one line that names the cause."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    last = lines[-1] if lines else "no output"
    if "PermissionError" in last or "Operation not permitted" in stderr or "ermission denied" in stderr:
        scope = procs.yama_scope()
        yama = f" (kernel.yama.ptrace_scope is {scope})" if scope else ""
        return f"the kernel refused to let pitstop write into PID {pid}{yama}: no ptrace permission ({last})"
    return f"sys.remote_exec on PID {pid} failed: {last}"
