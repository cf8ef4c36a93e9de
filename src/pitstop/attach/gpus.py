"""The GPUs a job's processes run on, and their NVML samples over the window: which GPU each PID uses comes
from NVML's running compute processes (not a guess from the rank number); each GPU is read by the probe's
own ``NvmlSampler`` at 10 Hz from pitstop's process. Without pynvml or a driver: no samples, and a note."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from pitstop.core.profile import GpuSample


@dataclass
class GpuWatch:
    """NVML samplers for the GPUs the given PIDs use."""

    nvml: Any = None
    of_pid: dict[int, int] = field(default_factory=dict)  # pid -> NVML index (the first it runs on)
    held: dict[int, int] = field(default_factory=dict)  # pid -> how many GPUs it runs on (a device map: >1)
    names: dict[int, str] = field(default_factory=dict)  # NVML index -> name
    samples: dict[int, list[GpuSample]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    _samplers: dict[int, Any] = field(default_factory=dict)

    def start(self, origin: float) -> None:
        from pitstop.probe.collectors.samplers import NvmlSampler

        for index in sorted(set(self.of_pid.values())):
            handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
            sampler = NvmlSampler(self.nvml, handle, origin)
            self._samplers[index] = sampler
            sampler.start()

    def stop(self) -> None:
        for index, sampler in self._samplers.items():
            sampler.stop()
            self.samples[index] = list(sampler.samples)
        if self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()


def _name(nvml: Any, handle: Any) -> str:
    name = nvml.nvmlDeviceGetName(handle)
    return name.decode() if isinstance(name, bytes) else str(name)


def map_pids(nvml: Any, pids: set[int]) -> tuple[dict[int, int], dict[int, str], dict[int, int]]:
    """For each of ``pids`` that runs compute on a GPU: pid -> its first NVML index, NVML index -> name, and
    pid -> how many GPUs NVML lists it on (a process holds a context only where it computes or allocates)."""
    on: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for index in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        running = []
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            with contextlib.suppress(Exception):
                running += list(getattr(nvml, fn)(handle))
        for proc in running:
            pid = int(getattr(proc, "pid", -1))
            if pid in pids and index not in on.setdefault(pid, []):
                on[pid].append(index)
                if index not in names:
                    names[index] = _name(nvml, handle)
    return {pid: gpus[0] for pid, gpus in on.items()}, names, {pid: len(gpus) for pid, gpus in on.items()}


def watch_gpus(pids: set[int], nvml: Any = None) -> GpuWatch:
    """A GpuWatch for the GPUs ``pids`` use (not started); empty, with a note, where NVML cannot answer
    (in a container NVML may not see the host's PIDs: then nothing is matched, and the note says so)."""
    watch = GpuWatch()
    try:
        if nvml is None:
            import pynvml

            nvml = pynvml
        nvml.nvmlInit()
    except Exception as exc:  # no pynvml, no driver
        watch.notes.append(
            f"GPUs not sampled: NVML unavailable ({type(exc).__name__}); pip install 'pitstop[nvml]'"
        )
        return watch
    watch.nvml = nvml
    try:
        watch.of_pid, watch.names, watch.held = map_pids(nvml, pids)
    except Exception as exc:
        watch.notes.append(f"GPUs not sampled: NVML could not list processes ({exc})")
    if not watch.of_pid:
        watch.notes.append("GPUs not sampled: NVML shows none of the job's PIDs (another PID namespace?)")
    return watch
