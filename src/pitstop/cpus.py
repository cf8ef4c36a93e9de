"""How many CPU cores this process may use: its affinity mask and its cgroup's CPU quota, whichever is less.

``os.cpu_count()`` counts the machine; a container or a ``taskset`` gets fewer. Shared by the probe (what the
job may use) and the thread-count remedy (what a trial sets). Standard library only.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def affinity_cores() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _own_cgroup_dirs(root: Path, proc_cgroup: Path) -> list[Path]:
    """The process's own cgroup folders (v2 and v1's cpu controller) first, then the mount's root."""
    dirs: list[Path] = []
    for line in (_read(proc_cgroup) or "").splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        rel = path.lstrip("/")
        if controllers == "":
            dirs.append(root / rel)
        elif "cpu" in controllers.split(","):
            dirs += [root / "cpu" / rel, root / "cpu,cpuacct" / rel]
    return [*dirs, root, root / "cpu", root / "cpu,cpuacct"]


def cgroup_cores(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPU quota in cores (quota / period), or None when there is none."""
    for folder in _own_cgroup_dirs(root, proc_cgroup):
        v2 = _read(folder / "cpu.max")
        if v2 is not None:
            quota, _, period = v2.partition(" ")
            if quota == "max":
                return None
            try:
                return int(quota) / int(period or "100000")
            except ValueError:
                return None
        quota_us = _read(folder / "cpu.cfs_quota_us")
        if quota_us is not None:
            period_us = _read(folder / "cpu.cfs_period_us") or "100000"
            try:
                q, p = int(quota_us), int(period_us)
            except ValueError:
                return None
            return None if q <= 0 or p <= 0 else q / p
    return None


def cores_allowed() -> int:
    """Whole cores this process may keep busy (at least 1)."""
    cores = affinity_cores() or os.cpu_count() or 1
    quota = cgroup_cores()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def local_ranks() -> int:
    """Training processes on this machine, from the launcher's variables (torchrun, accelerate, deepspeed)."""
    for name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1
