"""The machine's links read from NVML, once per node (by the process of local rank 0), at the measured window's
end: the GPUs have trained through the window, so the PCIe generation read is the one under load (an idle GPU
drops its link to Gen1 to save power, which would read as a fault).

Per GPU: each NVLink's state (``nvmlDeviceGetNvLinkState``, links 0 … 17, a link the GPU does not have raises),
the PCIe generation and width running and their maxima (``nvmlDeviceGetCurrPcieLinkGeneration`` /
``MaxPcieLinkGeneration`` / ``CurrPcieLinkWidth`` / ``MaxPcieLinkWidth``). Per pair: the PCIe path
(``nvmlDeviceGetTopologyCommonAncestor``: the words of ``nvidia-smi topo -m``), NVLinks between the two (each
active link's remote PCI bus id: the peer GPU, or an NVSwitch every GPU reaches), and whether P2P reads work
(``nvmlDeviceGetP2PStatus``). Every call is guarded: an ``NVMLError`` (a call the GPU or driver lacks) leaves
that fact unknown. ``read_links`` takes any object with pynvml's functions: tests pass a recorded one."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from typing import Any

from pitstop.core.profile import GpuLinks, GpuPair, LinkPath, RankProfile, Topology
from pitstop.probe.collectors.base import Collector, collector

NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS
NVML_FEATURE_ENABLED = 1
NVML_P2P_CAPS_INDEX_READ = 0
NVML_P2P_STATUS_OK = 0
# nvmlGpuTopologyLevel_t -> topo -m's word (NVML_TOPOLOGY_INTERNAL, 0, is one board's two GPUs: PIX)
TOPOLOGY_LEVELS = {
    0: LinkPath.PIX,
    10: LinkPath.PIX,
    20: LinkPath.PXB,
    30: LinkPath.PHB,
    40: LinkPath.NODE,
    50: LinkPath.SYS,
}
MAX_GPUS = 64  # more GPUs than one node holds: a broken count, not read


def _call(nvml: Any, fn: str, *args: Any) -> Any:
    """``nvml.fn(*args)``; None for a function this pynvml lacks or a call the GPU refuses (NVMLError)."""
    try:
        return getattr(nvml, fn)(*args)
    except Exception:
        return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _bus(value: Any) -> str | None:
    """A PCI bus id for comparing ("00000000:18:00.0" and "0000:18:00.0" alike): bus, device, function."""
    text = _text(getattr(value, "busId", None) if value is not None else None)
    if not text:
        return None
    return ":".join(text.lower().split(":")[-2:])


def _gpu(nvml: Any, index: int, handle: Any) -> tuple[GpuLinks, list[str | None]]:
    """One GPU's links and, per active NVLink, the remote end's bus id."""
    gpu = GpuLinks(index=index, name=_text(_call(nvml, "nvmlDeviceGetName", handle)))
    remotes: list[str | None] = []
    active = inactive = 0
    for link in range(NVLINK_MAX_LINKS):
        state = _call(nvml, "nvmlDeviceGetNvLinkState", handle, link)
        if state is None:
            continue  # a link this GPU does not have
        if int(state) == NVML_FEATURE_ENABLED:
            active += 1
            remote = _call(nvml, "nvmlDeviceGetNvLinkRemotePciInfo_v2", handle, link)
            if remote is None:
                remote = _call(nvml, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
            remotes.append(_bus(remote))
        else:
            inactive += 1
    if active or inactive:
        gpu.nvlinks_active, gpu.nvlinks_inactive = active, inactive
    for field, fn in (
        ("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
        ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
        ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth"),
        ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth"),
    ):
        value = _call(nvml, fn, handle)
        if value is not None and int(value) > 0:
            setattr(gpu, field, int(value))
    return gpu, remotes


def _pair(
    nvml: Any,
    a: tuple[int, Any, str | None, list[str | None]],
    b: tuple[int, Any, str | None, list[str | None]],
) -> GpuPair | None:
    """The path between two GPUs: NVLink when links join them (directly, or both to NVSwitches), else the
    PCIe common ancestor; P2P read status beside it."""
    (ia, ha, bus_a, remote_a), (ib, hb, bus_b, remote_b) = a, b
    direct = sum(1 for r in remote_a if r is not None and r == bus_b)
    switched = direct == 0 and bus_a not in remote_b and _through_switches(remote_a, remote_b)
    status = _call(nvml, "nvmlDeviceGetP2PStatus", ha, hb, NVML_P2P_CAPS_INDEX_READ)
    p2p = None if status is None else int(status) == NVML_P2P_STATUS_OK
    if direct or switched:
        links = direct or len(remote_a)
        return GpuPair(a=ia, b=ib, path=LinkPath.NVLINK, nvlinks=links, p2p=p2p)
    level = _call(nvml, "nvmlDeviceGetTopologyCommonAncestor", ha, hb)
    path = TOPOLOGY_LEVELS.get(int(level)) if level is not None else None
    return None if path is None and p2p is None else GpuPair(a=ia, b=ib, path=path or LinkPath.SYS, p2p=p2p)


def _through_switches(remote_a: list[str | None], remote_b: list[str | None]) -> bool:
    """Both GPUs' links end on the same devices (NVSwitches), none of them the other GPU."""
    ends_a, ends_b = Counter(r for r in remote_a if r), Counter(r for r in remote_b if r)
    return bool(ends_a) and set(ends_a) == set(ends_b)


def read_links(nvml: Any, indices: list[int] | None = None) -> Topology | None:
    """The node's GPUs and the links between them, through any object with pynvml's functions; None when
    not even the GPU count can be read. ``indices``: the NVML indices of the job's GPUs (all where None)."""
    count = _call(nvml, "nvmlDeviceGetCount")
    if count is None or not 0 < int(count) <= MAX_GPUS:
        return None
    wanted = [i for i in (indices or range(int(count))) if 0 <= i < int(count)]
    read: list[tuple[int, Any, str | None, list[str | None]]] = []
    topo = Topology(sources=["nvml"])
    for index in wanted:
        handle = _call(nvml, "nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            continue
        gpu, remotes = _gpu(nvml, index, handle)
        gpu.pcie_read_busy = True
        topo.gpus.append(gpu)
        read.append((index, handle, _bus(_call(nvml, "nvmlDeviceGetPciInfo", handle)), remotes))
    for i, a in enumerate(read):
        for b in read[i + 1 :]:
            pair = _pair(nvml, a, b)
            if pair is not None:
                topo.pairs.append(pair)
    return topo if topo.gpus else None


def job_indices(visible: str | None) -> list[int] | None:
    """The NVML indices of ``CUDA_VISIBLE_DEVICES`` when it lists numbers; None (every GPU) otherwise."""
    if not visible:
        return None
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    return [int(p) for p in parts] if parts and all(p.isdigit() for p in parts) else None


@collector
class LinksCollector(Collector):
    """The node's links, read once at the window's end by the node's first process on a CUDA GPU."""

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.links: Topology | None = None
        self._read = False

    def stop_window(self) -> None:
        if self._read:
            return
        self._read = True
        if not self.ctx.on_cuda or self.ctx.config.nvml_replay is not None:
            return
        if int(os.environ.get("LOCAL_RANK", "0") or 0) != 0:
            return  # one process per node reads the node
        try:
            import pynvml
        except ImportError:
            return  # the samplers' note already says pitstop[nvml] is missing
        try:
            pynvml.nvmlInit()
        except Exception as exc:
            self.ctx.errors.append(f"links not read: NVML unavailable ({exc})")
            return
        try:
            self.links = read_links(pynvml, job_indices(os.environ.get("CUDA_VISIBLE_DEVICES")))
        except Exception as exc:  # a reader failure loses the links, never the run
            self.ctx.errors.append(f"links not read: {type(exc).__name__}: {exc}")
        finally:
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()

    def fill(self, draft: RankProfile) -> None:
        if self.links is not None:
            draft.environment.links = self.links
