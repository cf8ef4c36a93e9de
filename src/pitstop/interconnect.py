"""Links between ranks and what bus bandwidth a collective should reach on them. Pure data.

Rates are per GPU, one direction, in GB/s (1e9 bytes/s), from the vendors' specifications: NVLink's
per-GPU total is quoted for both directions together, so it is halved here; a PCIe x16 slot and a network
port are quoted per direction. A bus bandwidth (nccl-tests' busbw) is compared with this rate: NCCL
reaches about 80% of it on large messages, which is the "should give" figure.
"""

from __future__ import annotations

from dataclasses import dataclass

from pitstop.core.profile import LinkPath, Topology
from pitstop.core.vocabulary import Device, StrEnum
from pitstop.hardware import lookup_gpu

ACHIEVABLE = 0.8  # share of a link's rate NCCL's bus bandwidth reaches on large messages


@dataclass(frozen=True)
class Link:
    key: str
    gbps: float  # GB/s per GPU, one direction
    source: str

    @property
    def expected_busbw_gbps(self) -> float:
        return self.gbps * ACHIEVABLE


LINKS: dict[str, Link] = {
    link.key: link
    for link in (
        Link("nvlink1", 80.0, "NVIDIA P100: 4 NVLink 1.0 links, 160 GB/s total"),
        Link("nvlink2", 150.0, "NVIDIA V100: 6 NVLink 2.0 links, 300 GB/s total"),
        Link("nvlink3", 300.0, "NVIDIA A100: 12 NVLink 3.0 links, 600 GB/s total"),
        Link("nvlink4", 450.0, "NVIDIA H100/H200 SXM: 18 NVLink 4.0 links, 900 GB/s total"),
        Link("nvlink5", 900.0, "NVIDIA B200: 18 NVLink 5.0 links, 1.8 TB/s total"),
        Link("pcie3", 15.75, "PCIe 3.0 x16: 8 GT/s × 16 lanes, 128b/130b"),
        Link("pcie4", 31.5, "PCIe 4.0 x16: 16 GT/s × 16 lanes"),
        Link("pcie5", 63.0, "PCIe 5.0 x16: 32 GT/s × 16 lanes"),
        Link("pcie6", 121.0, "PCIe 6.0 x16: 64 GT/s × 16 lanes, PAM4 + FLIT"),
        Link("ib_edr", 12.5, "InfiniBand EDR: 100 Gb/s per port"),
        Link("ib_hdr", 25.0, "InfiniBand HDR: 200 Gb/s per port"),
        Link("ib_ndr", 50.0, "InfiniBand NDR: 400 Gb/s per port"),
        Link("ib_xdr", 100.0, "InfiniBand XDR: 800 Gb/s per port"),
        Link("eth10", 1.25, "10 GbE"),
        Link("eth25", 3.125, "25 GbE"),
        Link("eth100", 12.5, "100 GbE (RoCE at the same rate)"),
        Link("eth200", 25.0, "200 GbE (RoCE at the same rate)"),
        Link("eth400", 50.0, "400 GbE (RoCE at the same rate)"),
    )
}

# The intra-node NVLink generation of the GPUs that have one (SXM parts); PCIe cards talk over PCIe.
NVLINK_OF_GPU: dict[str, str] = {
    "P100": "nvlink1",
    "V100": "nvlink2",
    "A100": "nvlink3",
    "H100": "nvlink4",
    "H200": "nvlink4",
    "H800": "nvlink4",
    "B200": "nvlink5",
}


@dataclass(frozen=True)
class Transport:
    """What carries a run's collectives, as far as can be told from the backend, GPU and settings."""

    name: str
    link: Link | None
    basis: str
    warnings: tuple[str, ...] = ()


def transport(
    backend: str | None,
    device: Device | None,
    gpu_name: str | None,
    nodes: int | None,
    comm_env: dict[str, str] | None,
    environ: dict[str, str] | None = None,
) -> Transport:
    """The likely transport and the link it should run at. NCCL does not say which it chose unless
    ``NCCL_DEBUG=INFO`` is set, so this reads the settings that force a choice."""
    env = dict(comm_env or {}) if environ is None else environ
    warnings: list[str] = []
    if backend == "gloo" and device in (Device.CUDA, Device.ROCM):
        warnings.append("gloo moves CUDA tensors through host memory over TCP: use the nccl backend on GPUs")
    if backend == "gloo" or device == Device.CPU:
        return Transport(
            "gloo (TCP through the host)", None, "no link reference for gloo on CPU", tuple(warnings)
        )
    if env.get("NCCL_P2P_DISABLE") == "1":
        warnings.append(
            "NCCL_P2P_DISABLE=1 is set: GPUs in a node talk through host memory, not NVLink/PCIe P2P"
        )
    if env.get("NCCL_IB_DISABLE") == "1" or env.get("NCCL_NET", "").lower() == "socket":
        warnings.append("NCCL_IB_DISABLE=1 / NCCL_NET=Socket is set: NCCL uses TCP sockets between nodes")
    multi_node = (nodes or 1) > 1
    if multi_node:
        if any("IB_DISABLE" in w or "Socket" in w for w in warnings):
            return Transport(
                "NCCL over sockets", LINKS["eth100"], "sockets: at most a 100 GbE port", tuple(warnings)
            )
        return Transport(
            "NCCL between nodes (InfiniBand or RoCE when present)",
            LINKS["ib_ndr"],
            "assumed one 400 Gb/s NIC per GPU (NDR/400 GbE); set by the cluster, not detectable here",
            tuple(warnings),
        )
    model = next((k for k in NVLINK_OF_GPU if gpu_name and k in gpu_name.upper()), None)
    if model is not None and "PCIE" not in (gpu_name or "").upper() and env.get("NCCL_P2P_DISABLE") != "1":
        link = LINKS[NVLINK_OF_GPU[model]]
        return Transport(f"NCCL over {link.key}", link, f"{model} SXM: {link.source}", tuple(warnings))
    return Transport("NCCL over PCIe", LINKS["pcie4"], "assumed PCIe 4.0 x16 between GPUs", tuple(warnings))


# -- what a machine's measured links allow (NVML, nvidia-smi topo -m / nvlink -s, NCCL's init log) ----------

# GB/s per lane, one direction: 2.5, 5 GT/s with 8b/10b; 8, 16, 32 GT/s with 128b/130b; 64 GT/s PAM4 + FLIT
PCIE_LANE_GBPS: dict[int, float] = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
# one NVLink's rate, one direction, by generation (the per-GPU totals above over their link counts)
NVLINK_LINK_GBPS: dict[str, float] = {
    "nvlink1": 20.0,
    "nvlink2": 25.0,
    "nvlink3": 25.0,
    "nvlink4": 25.0,
    "nvlink5": 50.0,
}
# Assumed: across CPU sockets (topo -m's SYS) NCCL leaves P2P off and stages through host memory over the
# SMP link; nccl-tests on two-socket PCIe servers reach about half the single-switch bus bandwidth.
SYS_SHARE = 0.5
SOCKET_LINK = "eth100"  # NET/Socket: TCP through the host, at most a 100 GbE port (as `transport` assumes)
IB_LINK = "ib_ndr"  # NET/IB: one 400 Gb/s NIC per GPU assumed (the rate is the cluster's, not in the log)
GEFORCE = ("RTX", "GEFORCE", "TITAN")  # consumer cards: the driver turns PCIe P2P off, SHM is their normal


def pcie_link(gen: int, width: int = 16) -> Link:
    """A PCIe link of ``gen`` at ``width`` lanes (one direction)."""
    per_lane = PCIE_LANE_GBPS.get(gen, PCIE_LANE_GBPS[4])
    return Link(f"pcie{gen}x{width}", per_lane * width, f"PCIe {gen}.0 x{width}: {per_lane:g} GB/s per lane")


def nvlink_link(links: int, per_link_gbps: float, basis: str) -> Link:
    """``links`` NVLinks of ``per_link_gbps`` each (one direction), the GPU's whole NVLink bandwidth."""
    return Link(
        f"nvlink×{links}", links * per_link_gbps, f"{links} NVLinks × {per_link_gbps:g} GB/s ({basis})"
    )


class Fault(StrEnum):
    """A link running below what the machine has: each is a fix, not a trade."""

    SOCKET = "socket"  # NCCL between nodes over TCP sockets (NET/Socket): no InfiniBand / RoCE in use
    PCIE_WIDTH = "pcie_width"  # a GPU's PCIe link runs fewer lanes than card and slot have
    PCIE_GEN = "pcie_gen"  # a GPU's PCIe link runs below its generation while the job trained
    NVLINK_DOWN = "nvlink_down"  # NVLinks of a GPU are inactive
    SHM = "shm"  # NCCL went through host memory (SHM) between GPUs that have P2P (NVLink, one PCIe switch)


@dataclass(frozen=True)
class Ceiling:
    """The bus bandwidth a machine's links allow a ring collective over the job's GPUs: the slowest hop."""

    link: Link
    kind: str  # "nvlink", "pcie", "pcie_sys" (crosses CPU sockets), "network"
    measured: bool  # the links were read (NVML, nvidia-smi, NCCL's log), not assumed from the GPU's name
    basis: str
    faults: tuple[Fault, ...] = ()
    fault_notes: tuple[str, ...] = ()
    healthy: Link | None = None  # the link this machine would give without its faults

    @property
    def busbw_gbps(self) -> float:
        return self.link.expected_busbw_gbps


def _gen_of(gpu_name: str | None) -> str | None:
    upper = (gpu_name or "").upper()
    model = next((k for k in NVLINK_OF_GPU if k in upper), None)
    return None if model is None or "PCIE" in upper else NVLINK_OF_GPU[model]


def _pcie_faults(topology: Topology) -> tuple[list[Fault], list[str]]:
    faults: list[Fault] = []
    notes: list[str] = []
    for g in topology.gpus:
        if g.pcie_width and g.pcie_width_max and g.pcie_width < g.pcie_width_max:
            faults.append(Fault.PCIE_WIDTH)
            notes.append(f"GPU {g.index}: PCIe x{g.pcie_width} of x{g.pcie_width_max}")
        if g.pcie_gen and g.pcie_gen_max and g.pcie_gen < g.pcie_gen_max and g.pcie_read_busy:
            faults.append(Fault.PCIE_GEN)
            notes.append(f"GPU {g.index}: PCIe Gen{g.pcie_gen} of Gen{g.pcie_gen_max} while training")
        if g.nvlinks_inactive:
            faults.append(Fault.NVLINK_DOWN)
            notes.append(f"GPU {g.index}: {g.nvlinks_inactive} NVLinks inactive")
    return faults, notes


def _intra(topology: Topology, gpu_name: str | None) -> tuple[Link, Link, str, str]:
    """(link as it runs, link as it should run, kind, basis) inside one node."""
    pairs = topology.pairs
    gen = _gen_of(gpu_name or next((g.name for g in topology.gpus if g.name), None))
    all_nvlink = bool(pairs) and all(p.path == LinkPath.NVLINK for p in pairs)
    if not pairs and any(g.nvlinks_active for g in topology.gpus):
        all_nvlink = True  # nvlink -s / NVML alone: the GPUs' links are up
    if all_nvlink:
        counts = [g.nvlinks_active for g in topology.gpus if g.nvlinks_active]
        pair_counts = [p.nvlinks for p in pairs if p.nvlinks]
        links = min(counts) if counts else min(pair_counts)
        full = max([(g.nvlinks_active or 0) + (g.nvlinks_inactive or 0) for g in topology.gpus] + [links])
        rates = [g.nvlink_gbps for g in topology.gpus if g.nvlink_gbps]
        per_link = min(rates) if rates else NVLINK_LINK_GBPS.get(gen or "", 25.0)
        said = "nvidia-smi nvlink -s" if rates else (f"{gen} per link" if gen else "assumed 25 GB/s per link")
        return (
            nvlink_link(links, per_link, said),
            nvlink_link(full, per_link, said),
            "nvlink",
            f"NVLink between every pair ({', '.join(topology.sources)})",
        )
    gens = [g.pcie_gen for g in topology.gpus if g.pcie_gen and (g.pcie_read_busy or not g.pcie_gen_max)]
    max_gens = [g.pcie_gen_max for g in topology.gpus if g.pcie_gen_max]
    widths = [g.pcie_width for g in topology.gpus if g.pcie_width]
    max_widths = [g.pcie_width_max for g in topology.gpus if g.pcie_width_max]
    spec = lookup_gpu(gpu_name or next((g.name for g in topology.gpus if g.name), None))
    best_gen = min(max_gens) if max_gens else (spec.pcie_gen if spec else 4)
    run_gen = min(gens) if gens else best_gen
    healthy = pcie_link(best_gen, min(max_widths) if max_widths else 16)
    running = pcie_link(run_gen, min(widths) if widths else (min(max_widths) if max_widths else 16))
    read = (
        "as read" if gens or widths else ("the GPU's generation, x16 assumed" if spec else "Gen4 x16 assumed")
    )
    basis = f"no NVLink between the GPUs: PCIe, {read}"
    if any(p.path == LinkPath.SYS for p in topology.pairs):
        running = Link(f"{running.key} across sockets", running.gbps * SYS_SHARE, running.source)
        healthy = Link(f"{healthy.key} across sockets", healthy.gbps * SYS_SHARE, healthy.source)
        return (
            running,
            healthy,
            "pcie_sys",
            basis + f"; GPUs on different CPU sockets (SYS): ×{SYS_SHARE:g} assumed",
        )
    return running, healthy, "pcie", basis


def ceiling(topology: Topology | None, gpu_name: str | None, nodes: int | None) -> Ceiling | None:
    """What the read links allow a ring all-reduce over the job's GPUs; None without any read link."""
    if topology is None or not (
        topology.gpus or topology.pairs or topology.nccl_intra or topology.nccl_inter
    ):
        return None
    faults, notes = _pcie_faults(topology)
    measured = True
    if topology.gpus or topology.pairs:
        link, healthy, kind, basis = _intra(topology, gpu_name)
    else:  # NCCL's log alone: which transport, not which link
        assumed = transport("nccl", Device.CUDA, gpu_name, 1, {}).link or LINKS["pcie4"]
        link, healthy, kind = assumed, assumed, "nvlink" if assumed.key.startswith("nvlink") else "pcie"
        basis = f"the GPU's link assumed ({assumed.source}); NCCL's log names the transport only"
        measured = False
    if "SHM" in topology.nccl_intra and _p2p_expected(topology, gpu_name):
        faults.append(Fault.SHM)
        notes.append("NCCL moved data through host memory (SHM) between GPUs that have P2P")
    many_nodes = (topology.nccl_nodes or nodes or 1) > 1
    if many_nodes:
        socket = "NET/Socket" in topology.nccl_inter or (topology.nccl_net or "").lower() == "socket"
        net = LINKS[SOCKET_LINK if socket else IB_LINK]
        if socket:
            faults.append(Fault.SOCKET)
            notes.append("NCCL between nodes over TCP sockets (NET/Socket)")
        if net.gbps < link.gbps:
            said = (
                "NCCL's log: NET/Socket" if socket else "NCCL's log: NET/IB, one 400 Gb/s NIC per GPU assumed"
            )
            if not topology.nccl_inter and not topology.nccl_net:
                said = "between nodes: one 400 Gb/s NIC per GPU assumed"
            return Ceiling(
                net, "network", socket, said, tuple(dict.fromkeys(faults)), tuple(notes), LINKS[IB_LINK]
            )
    return Ceiling(link, kind, measured, basis, tuple(dict.fromkeys(faults)), tuple(notes), healthy)


def _p2p_expected(topology: Topology, gpu_name: str | None) -> bool:
    """Whether P2P should have carried NCCL's traffic: NVLink between the GPUs, or every pair behind PCIe
    switches (PIX / PXB) with P2P not refused, on a card whose driver allows P2P (not GeForce)."""
    name = (gpu_name or next((g.name for g in topology.gpus if g.name), "") or "").upper()
    if any(word in name for word in GEFORCE) and "RTX A" not in name and "RTX 6000" not in name:
        return False
    if any(p.path == LinkPath.NVLINK for p in topology.pairs) or any(g.nvlinks_active for g in topology.gpus):
        return True
    pairs = topology.pairs
    return bool(pairs) and all(p.path in (LinkPath.PIX, LinkPath.PXB) and p.p2p is not False for p in pairs)


def scaling_bound(gpus: int, compute_s: float, comm_s: float) -> tuple[float, float]:
    """(at most, without overlap): the speed-up of ``gpus`` GPUs over one when each step computes
    ``compute_s`` and moves data for ``comm_s`` at the link's bus bandwidth. Hidden entirely, a step still
    lasts the longer of the two; not hidden at all, their sum."""
    if compute_s <= 0:
        return 0.0, 0.0
    return gpus * compute_s / max(compute_s, comm_s), gpus * compute_s / (compute_s + comm_s)
