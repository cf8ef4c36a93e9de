"""Threads against cores: what the job asked for (torch's thread pools, $OMP_NUM_THREADS, ranks on this
machine, read at the first step) and how many of its threads were runnable during the window (sampled on a
thread of its own from the window's start; the means go into the environment's ``cpu``).

The load sampler reads ``/proc/<pid>/task/*/stat`` of the training process and its children (DataLoader
workers) a few times a second and counts threads in state R (running or waiting for a core; an OpenMP
thread that spins counts). The machine's run queue (``procs_running``) and the hypervisor's steal come
along as context: other tenants load a shared machine too. A failure loses the figures, never the run.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any

from pitstop.core.profile import CpuThreads, RankProfile
from pitstop.cpus import cgroup_cores, cores_allowed, local_ranks
from pitstop.probe.collectors.base import Collector, ProbeContext, collector

PROC = Path("/proc")


def thread_facts() -> CpuThreads:
    import torch

    return CpuThreads(
        cores_allowed=cores_allowed(),
        machine_cores=os.cpu_count(),
        cgroup_cores=cgroup_cores(),
        torch_threads=torch.get_num_threads(),
        interop_threads=torch.get_num_interop_threads(),
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
        local_ranks=local_ranks(),
        launcher="torchrun" if os.environ.get("TORCHELASTIC_RUN_ID") else None,
    )


def runnable_threads(pid: int, proc: Path = PROC) -> int:
    """Threads of ``pid`` in state R."""
    count = 0
    for stat in (proc / str(pid) / "task").glob("*/stat"):
        with contextlib.suppress(OSError, IndexError):
            text = stat.read_text()
            if text[text.rindex(")") + 2] == "R":  # the name in parentheses may hold spaces
                count += 1
    return count


def machine_run_queue(proc: Path = PROC) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in (proc / "stat").read_text().splitlines():
            if line.startswith("procs_running "):
                return int(line.split()[1])
    return None


def _children(pid: int, proc: Path = PROC) -> list[int]:
    """Descendants of ``pid`` (DataLoader workers and what they start)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in (proc / str(parent) / "task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                kids = [int(k) for k in task.read_text().split()]
                found += kids
                todo += kids
    return found


class ThreadLoad:
    """Samples the job's runnable threads during the window (~5 Hz), on a daemon thread."""

    def __init__(self, interval_s: float = 0.2, proc: Path = PROC) -> None:
        self.interval_s = interval_s
        self.proc = proc
        self.pid = os.getpid()
        self._job: list[int] = []
        self._machine: list[int] = []
        self._stop = threading.Event()
        self._steal0 = self._cpu_times()
        self._thread = threading.Thread(target=self._run, name="pitstop-ThreadLoad", daemon=True)
        self._thread.start()

    @staticmethod
    def _cpu_times() -> Any:
        try:
            import psutil

            return psutil.cpu_times()
        except Exception:
            return None

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                pids = [self.pid, *_children(self.pid, self.proc)]
                # this sampler is itself running while it reads: it does not count
                self._job.append(max(0, sum(runnable_threads(p, self.proc) for p in pids) - 1))
                queue = machine_run_queue(self.proc)
                if queue is not None:
                    self._machine.append(max(0, queue - 1))
                self._stop.wait(self.interval_s)
        except Exception:  # /proc unreadable: no load figures
            return

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            if self._thread is not threading.current_thread():
                self._thread.join(timeout=2.0)

    def stop_into(self, facts: CpuThreads) -> None:
        """Stop sampling (once) and write the means into ``facts``."""
        self.stop()
        if self._job:
            facts.runnable_threads = round(sum(self._job) / len(self._job), 2)
        if self._machine:
            facts.machine_run_queue = round(sum(self._machine) / len(self._machine), 2)
        end = self._cpu_times()
        if self._steal0 is not None and end is not None and hasattr(end, "steal"):
            total = sum(end) - sum(self._steal0)
            facts.steal_frac = round((end.steal - self._steal0.steal) / total, 4) if total > 0 else None


@collector
class ThreadLoadCollector(Collector):
    """The counters are ``ThreadLoad``'s samples; None until the window starts."""

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.load: ThreadLoad | None = None

    def begin(self) -> None:
        if self.ctx.environment is not None:
            self.ctx.environment.cpu = thread_facts()  # what the job asked for: pools, OMP, ranks, cores

    def start_window(self) -> None:
        self.load = ThreadLoad()

    def stop_window(self) -> None:
        if self.load is not None:
            self.load.stop()

    def fill(self, draft: RankProfile) -> None:
        cpu = draft.environment.cpu
        if self.load is not None and cpu is not None:
            self.load.stop_into(cpu)
