"""NCCL's own init log, asked for on several GPUs and read back: the one record of which transport NCCL chose
(P2P over NVLink or PCIe, SHM through host memory, InfiniBand or sockets between nodes).

The job is started with ``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=INIT,NET`` (the init and network lines, no
per-collective chatter) and ``NCCL_DEBUG_FILE=<pitstop's run folder>/nccl.%h.%p.log`` (one file per host and
process, NCCL's own placeholders): NCCL writes there instead of the job's output, which stays as it was. None of
it is set where the user set ``NCCL_DEBUG`` or ``NCCL_DEBUG_FILE`` (their logging is theirs), nor on a machine
with fewer than two NVIDIA GPUs visible (one GPU has no links to read; gloo on CPUs never reads them)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pitstop.core.profile import Topology
from pitstop.ingest.nccl_log import NcclReader
from pitstop.ingest.topology import merge_topology

LOG_PATTERN = "nccl.*.log"
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the driver holds
MAX_LOG_BYTES = 16 * 2**20  # an init log is kilobytes; a file that grew past this holds more than init


def visible_gpus(environ: Mapping[str, str], driver_gpus: Path = NVIDIA_GPUS) -> int:
    """NVIDIA GPUs this machine's driver holds, cut to ``CUDA_VISIBLE_DEVICES`` where it is set."""
    try:
        held = sum(1 for _ in driver_gpus.iterdir()) if driver_gpus.is_dir() else 0
    except OSError:
        held = 0
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return held
    listed = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
    return min(held, len(listed))


def nccl_log_env(environ: Mapping[str, str], out_dir: Path, gpus: int) -> dict[str, str]:
    """The variables that make NCCL log its init to pitstop's folder; empty where the user logs NCCL
    already or fewer than two GPUs are visible."""
    if gpus < 2 or "NCCL_DEBUG" in environ or "NCCL_DEBUG_FILE" in environ:
        return {}
    return {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": environ.get("NCCL_DEBUG_SUBSYS") or "INIT,NET",
        "NCCL_DEBUG_FILE": str(out_dir / "nccl.%h.%p.log"),
    }


def read_nccl_logs(out_dir: Path) -> Topology | None:
    """What NCCL's log files in ``out_dir`` say (all processes' lines into one reader); None without any."""
    reader = NcclReader()
    for path in sorted(out_dir.glob(LOG_PATTERN)):
        try:
            if not path.is_file() or path.is_symlink():
                continue
            with path.open("rb") as f:
                data = f.read(MAX_LOG_BYTES)
        except OSError:
            continue
        for line in data.decode("utf-8", errors="replace").splitlines():
            reader.feed(line)
    return reader.topology()


def add_nccl_links(env_links: Topology | None, out_dir: Path) -> Topology | None:
    """The links the rank already read (NVML) with NCCL's log added."""
    return merge_topology(env_links, read_nccl_logs(out_dir))
