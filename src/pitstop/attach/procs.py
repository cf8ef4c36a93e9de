"""What /proc says about the job's processes: who they are (the PID and every descendant), whether pitstop
may read them, and their threads, CPU use and affinity over the window. Linux only; nothing is written."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")


class AttachRefused(Exception):
    """The PID cannot be attached to; the message says why, in one line."""


def check_pid(pid: int) -> None:
    """Refuse a PID that does not exist, is a zombie, or that this user may not ptrace (other user without
    CAP_SYS_PTRACE, Yama's ptrace_scope)."""
    if pid <= 0:
        raise AttachRefused(f"{pid} is not a process id")
    if not (PROC / str(pid)).exists():
        raise AttachRefused(f"no process with PID {pid}")
    if pid == os.getpid():
        raise AttachRefused(f"PID {pid} is pitstop itself")
    state = _stat_fields(pid)
    if state and state[0] == "Z":
        raise AttachRefused(f"PID {pid} has exited (a zombie waiting for its parent)")
    try:
        uid = (PROC / str(pid)).stat().st_uid
    except OSError as exc:
        raise AttachRefused(f"PID {pid}: {exc.strerror}") from None
    root = os.geteuid() == 0
    if uid != os.geteuid() and not root:
        raise AttachRefused(
            f"PID {pid} belongs to another user (uid {uid}): ptrace is not allowed; run pitstop as that user"
        )
    scope = yama_scope()
    if scope == 3:
        raise AttachRefused("kernel.yama.ptrace_scope is 3: no process may be attached to on this machine")
    if scope == 2 and not root:
        raise AttachRefused("kernel.yama.ptrace_scope is 2: attaching needs CAP_SYS_PTRACE (run with sudo)")
    if scope == 1 and not root and pid not in descendants(os.getpid()):
        raise AttachRefused(
            "kernel.yama.ptrace_scope is 1: only a parent may attach; run with sudo, or "
            "'sudo sysctl kernel.yama.ptrace_scope=0'"
        )


def yama_scope() -> int | None:
    try:
        return int((PROC / "sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        return None


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name (field 3 onwards); [] when it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return []
    return text[text.rfind(")") + 2 :].split()


def children_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if len(fields) > 1:
                out.setdefault(int(fields[1]), []).append(int(entry.name))
    return out


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), in no set order."""
    kids = children_map()
    out, todo = [], list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def environ(pid: int, *names: str) -> dict[str, str]:
    """The named variables of a process's environment (its start-up environment), where readable."""
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    wanted = {n.encode() for n in names}
    return {k.decode(): v.decode(errors="replace") for k, v in pairs if k in wanted}


def cwd(pid: int) -> Path | None:
    try:
        return Path(os.readlink(PROC / str(pid) / "cwd"))
    except OSError:
        return None


def output_files(pid: int) -> list[Path]:
    """The regular files a process writes its stdout and stderr to (``python train.py > train.log 2>&1``):
    its log, where it keeps one; a terminal or a pipe is not a file."""
    import stat

    found: list[Path] = []
    for fd in (1, 2):
        link = PROC / str(pid) / "fd" / str(fd)
        try:
            target = Path(os.readlink(link))
            if not stat.S_ISREG(link.stat().st_mode):
                continue
        except OSError:
            continue
        if target.is_absolute() and target not in found and not target.name.endswith(" (deleted)"):
            found.append(target)
    return found


def cmdline(pid: int) -> list[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def affinity(pid: int) -> int | None:
    try:
        return len(os.sched_getaffinity(pid))
    except OSError:
        return None


@dataclass
class ProcReading:
    t: float
    cpu_s: float  # utime + stime so far
    threads: int
    runnable: int  # threads in state R


@dataclass
class ProcSeries:
    """Readings of one process over the window."""

    pid: int
    readings: list[ProcReading] = field(default_factory=list)

    def cpu_pct(self) -> float | None:
        """Mean CPU use over the window, in % of one core."""
        if len(self.readings) < 2:
            return None
        a, b = self.readings[0], self.readings[-1]
        return None if b.t <= a.t else 100.0 * (b.cpu_s - a.cpu_s) / (b.t - a.t)

    def threads(self) -> int | None:
        return max((r.threads for r in self.readings), default=None)

    def runnable(self) -> float | None:
        values = [r.runnable for r in self.readings]
        return sum(values) / len(values) if values else None


TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def read_proc(pid: int) -> ProcReading | None:
    """One reading: CPU seconds, threads and runnable threads (each thread's state from its task stat)."""
    fields = _stat_fields(pid)
    if len(fields) < 18:
        return None
    cpu_s = (int(fields[11]) + int(fields[12])) / TICK
    tasks = PROC / str(pid) / "task"
    runnable = threads = 0
    try:
        for task in tasks.iterdir():
            threads += 1
            try:
                text = (task / "stat").read_text()
            except OSError:
                continue
            runnable += text[text.rfind(")") + 2 : text.rfind(")") + 3] == "R"
    except OSError:
        return None
    return ProcReading(time.monotonic(), cpu_s, threads, runnable)


def parent(pid: int) -> int | None:
    fields = _stat_fields(pid)
    try:
        return int(fields[1]) if len(fields) > 1 else None
    except ValueError:
        return None


def gpu_devices(pid: int) -> list[int]:
    """The NVIDIA GPUs a process holds open (/dev/nvidiaN among its file descriptors): a fact, not a guess
    at the device it trains on."""
    found = set()
    try:
        for fd in (PROC / str(pid) / "fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            tail = target.removeprefix("/dev/nvidia")
            if target.startswith("/dev/nvidia") and tail.isdigit():
                found.add(int(tail))
    except OSError:
        return []
    return sorted(found)
