"""Links between ranks and what bus bandwidth a collective should reach on them. Pure data.

Rates are per GPU, one direction, in GB/s (1e9 bytes/s), from the vendors' specifications: NVLink's
per-GPU total is quoted for both directions together, so it is halved here; a PCIe x16 slot and a network
port are quoted per direction. A bus bandwidth (nccl-tests' busbw) is compared with this rate: NCCL
reaches about 80% of it on large messages, which is the "should give" figure.
"""

from __future__ import annotations

from dataclasses import dataclass

from pitstop.core.vocabulary import Device

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
