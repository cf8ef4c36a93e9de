"""Sampling a running job's Python stacks from outside, without pausing it: py-spy in non-blocking mode
(``--nonblocking``: it reads the target's memory while it runs, never stopping it, and drops a sample it
reads torn), idle ticks included (``--idle``: a thread sleeping in a slow ``__getitem__`` is still waiting),
for the PID and every process below it (``--subprocesses``: ranks and DataLoader workers).

One ``py-spy record`` for the whole window costs one process and a read of the target's stacks per tick;
``py-spy dump`` once per tick would start a process each time. The speedscope output keeps each thread's
samples in order, which the step counting needs (the raw format only counts stacks).

This is the fallback beside the full probe that ``remote`` / ``probed`` arm in the job by PEP 768's
``sys.remote_exec`` where Python allows it (3.14+)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pitstop.attach.gpus import GpuWatch, watch_gpus
from pitstop.attach.procs import AttachRefused, ProcSeries, descendants, gpu_devices, read_proc
from pitstop.attach.stacks import Frame, ThreadSamples


@dataclass
class Window:
    """What one sampling window collected."""

    pid: int
    seconds: float
    rate_hz: float
    threads: list[ThreadSamples] = field(default_factory=list)
    procs: dict[int, ProcSeries] = field(default_factory=dict)
    dropped: int = 0  # samples the sampler could not read (torn reads of a running process)
    gpu: GpuWatch = field(default_factory=GpuWatch)  # NVML samples of the GPUs the job's PIDs use
    sampler: str = "py-spy"


class Sampler(Protocol):
    def sample(self, pid: int, seconds: float, rate_hz: float) -> Window: ...


def find_py_spy() -> str:
    """The py-spy binary: beside this interpreter (a virtual environment's bin), else on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    if here.exists():
        return str(here)
    found = shutil.which("py-spy")
    if found is None:
        raise AttachRefused("py-spy is not installed: pip install 'pitstop[attach]'")
    return found


class PySpySampler:
    """``py-spy record --nonblocking --idle --subprocesses --format speedscope`` for one window, with /proc
    read every half second beside it."""

    def sample(self, pid: int, seconds: float, rate_hz: float) -> Window:
        binary = find_py_spy()
        with tempfile.TemporaryDirectory(prefix="pitstop-attach-") as tmp:
            out = Path(tmp) / "stacks.json"
            cmd = [binary, "record", "--pid", str(pid), "--rate", f"{rate_hz:g}"]
            cmd += ["--duration", f"{max(1, round(seconds))}", "--nonblocking", "--idle", "--subprocesses"]
            cmd += ["--full-filenames", "--format", "speedscope", "--output", str(out)]
            poller, gpu = _Poller(pid), _gpus_of(pid)
            poller.start()
            gpu.start(time.perf_counter())
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
            except subprocess.TimeoutExpired:
                raise AttachRefused("py-spy did not finish its window in time") from None
            finally:
                poller.stop()
                gpu.stop()
            if done.returncode != 0 or not out.exists():
                raise AttachRefused(_py_spy_error(pid, done.stderr + done.stdout))
            data = json.loads(out.read_text())
        window = Window(pid=pid, seconds=seconds, rate_hz=rate_hz, procs=poller.series, gpu=gpu)
        window.threads = read_speedscope(data, 1.0 / rate_hz)
        window.dropped = _errors(done.stderr + done.stdout)
        return window


def _gpus_of(pid: int) -> GpuWatch:
    """NVML only for a job that holds a GPU open (a CPU job never loads the library)."""
    pids = {pid, *descendants(pid)}
    return watch_gpus(pids) if any(gpu_devices(p) for p in pids) else GpuWatch()


def _py_spy_error(pid: int, text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("py-spy> Visit")]
    reason = next((ln for ln in lines if "rror" in ln or "ermission" in ln), lines[-1] if lines else "")
    if "ermission" in reason or "Operation not permitted" in reason:
        return f"PID {pid} may not be ptraced by this user ({reason}); run as its user or with sudo"
    return f"py-spy could not sample PID {pid}: {reason or 'no output'}"


def _errors(text: str) -> int:
    """'Samples: 282 Errors: 17' in py-spy's last line."""
    for line in reversed(text.splitlines()):
        if "Errors:" in line:
            try:
                return int(line.rsplit("Errors:", 1)[1].split()[0])
            except (IndexError, ValueError):
                return 0
    return 0


def read_speedscope(data: dict[str, Any], interval_s: float) -> list[ThreadSamples]:
    """py-spy's speedscope document -> one ThreadSamples per thread, frames outermost first, py-spy's own
    'process …' and 'thread …' pseudo-frames dropped."""
    frames = [
        Frame(str(f.get("name", "")), str(f.get("file") or ""), _line(f)) for f in data["shared"]["frames"]
    ]
    out = []
    for profile in data.get("profiles", []):
        ids = _ids(str(profile.get("name", "")))
        if ids is None:
            continue
        pid, tid, name = ids
        samples = ThreadSamples(pid=pid, tid=tid, name=name, interval_s=interval_s)
        for sample in profile.get("samples", []):
            stack = tuple(frames[i] for i in sample if frames[i].file)
            samples.stacks.append(stack)
        out.append(samples)
    return out


def _line(frame: dict[str, Any]) -> int:
    """The line a frame was on (py-spy records the current line of each frame), 0 when not given."""
    line = frame.get("line")
    return line if isinstance(line, int) and not isinstance(line, bool) and 0 < line < 2**31 else 0


def _ids(name: str) -> tuple[int, int, str] | None:
    """'Process 18085 Thread 18085 "MainThread"' -> (18085, 18085, 'MainThread')."""
    parts = name.split(maxsplit=4)
    if len(parts) < 4 or parts[0] != "Process" or parts[2] != "Thread":
        return None
    try:
        pid, tid = int(parts[1]), int(parts[3], 0)
    except ValueError:
        return None
    return pid, tid, parts[4].strip('"') if len(parts) > 4 else ""


class _Poller:
    """/proc readings of the PID and its descendants every half second, in a thread of pitstop's own."""

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        self.pid, self.every_s = pid, every_s
        self.series: dict[int, ProcSeries] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        pids: list[int] = []
        last_scan = 0.0
        while not self._stop.is_set():
            if time.monotonic() - last_scan > 2.0:  # new workers appear with each epoch
                pids = [self.pid, *descendants(self.pid)]
                last_scan = time.monotonic()
            for pid in pids:
                reading = read_proc(pid)
                if reading is not None:
                    self.series.setdefault(pid, ProcSeries(pid)).readings.append(reading)
            self._stop.wait(self.every_s)
