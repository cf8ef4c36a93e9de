"""Where a machine's links are written down: ``nvidia-smi topo -m`` (the GPU-to-GPU and GPU-to-NIC matrix) and
``nvidia-smi nvlink -s`` (each NVLink's rate, or ``<inactive>``), read into a ``Topology``. Pure parsers over the
text the tools print; ``merge_topology`` joins what several sources said (NVML, these, NCCL's log).

``topo -m`` prints a header row of column names (``GPU0 … NIC0 … CPU Affinity  NUMA Affinity  GPU NUMA ID``),
separated by tabs (or by spaces, as pasted), sometimes underlined with terminal escapes; a row per GPU and per
NIC whose cells are ``X`` (self), ``NV#`` (a bonded set of # NVLinks) or a PCIe path word (PIX, PXB, PHB, NODE,
SYS); then a legend and, with NICs, a ``NIC Legend`` naming each (``NIC0: mlx5_0``). ``nvlink -s`` prints
``GPU i: <name> (UUID: …)`` and under it ``Link n: 26.562 GB/s`` or ``Link n: <inactive>`` per link (a GPU
without NVLink: no link lines)."""

from __future__ import annotations

import re

from pitstop.core.profile import GpuLinks, GpuPair, LinkPath, Topology
from pitstop.interconnect import ceiling

ANSI = re.compile(r"\x1b\[[0-9;]*m")
COLUMN = re.compile(r"^(GPU|NIC|mlx\w*)(\d+)?$")
NV_CELL = re.compile(r"^NV(\d{1,3})$")
PATH_WORDS = {p.value: p for p in LinkPath if p != LinkPath.NVLINK}
NIC_LEGEND = re.compile(r"^\s*NIC(\d+):\s*(\S+)\s*$")
SMI_GPU = re.compile(r"^GPU (\d+): (.+?)(?: \(UUID: [^)]*\))?\s*$")
SMI_LINK = re.compile(r"^\s+Link (\d+): (?:([\d.]+) GB/s|<inactive>)\s*$")
MAX_GPUS = 1024
MAX_NVLINKS = 18  # NVLinks one GPU has at most (H100 / B200); more summed over peers means a switch


def looks_like_topo(head: str) -> bool:
    """A ``topo -m`` matrix: a header row that starts with GPU0 and a legend or a GPU0 row with X on it."""
    text = ANSI.sub("", head)
    header = re.search(r"^[ \t]*GPU0[ \t]+(?:GPU1|NIC0|CPU Affinity)", text, re.MULTILINE)
    return bool(header) and bool(re.search(r"^GPU0[ \t]+X\b|NV#\s+=|PIX\s+=", text, re.MULTILINE))


def looks_like_nvlink_status(head: str) -> bool:
    """``nvidia-smi nvlink -s``: a GPU line followed by its link lines."""
    return bool(re.search(r"^GPU \d+: .+\n\s+Link \d+: (?:[\d.]+ GB/s|<inactive>)", head, re.MULTILINE))


def _cells(line: str) -> list[str]:
    """A row's cells: tab-separated where the tool wrote tabs, else runs of two or more spaces."""
    line = ANSI.sub("", line).rstrip("\n")
    parts = line.split("\t") if "\t" in line else re.split(r" {2,}", line)
    return [p.strip() for p in parts]


def read_topo_matrix(text: str) -> Topology:
    """The GPU pairs' paths, the NICs and how far each GPU is from its nearest NIC, from ``topo -m``."""
    lines = [ANSI.sub("", raw) for raw in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines) if re.match(r"^[ \t]*GPU0\b", line)), None)
    if header_at is None:
        return Topology()
    columns = [c for c in _cells(lines[header_at]) if c]
    names = [c for c in columns if COLUMN.match(c)]
    topo = Topology(sources=["nvidia-smi topo -m"])
    gpus = [c for c in names if c.startswith("GPU")]
    seen: set[tuple[int, int]] = set()
    nic_rows: list[str] = []
    for line in lines[header_at + 1 :]:
        if not line.strip() or line.startswith("Legend"):
            break
        cells = [c for c in _cells(line)]
        row = cells[0]
        values = [c for c in cells[1:] if c != ""]
        if row.startswith("NIC"):
            nic_rows.append(row)
            continue
        match = re.match(r"^GPU(\d+)$", row)
        if match is None or len(gpus) > MAX_GPUS:
            continue
        a = int(match.group(1))
        for name, cell in zip(names, values, strict=False):
            if not name.startswith("GPU"):
                continue
            b = int(name[3:])
            if a == b or (min(a, b), max(a, b)) in seen:
                continue
            pair = _pair(a, b, cell)
            if pair is not None:
                seen.add((min(a, b), max(a, b)))
                topo.pairs.append(pair)
    topo.gpus = [GpuLinks(index=int(g[3:])) for g in gpus]
    for gpu in topo.gpus:
        counts = [p.nvlinks for p in topo.pairs if gpu.index in (p.a, p.b) and p.nvlinks]
        if counts:  # a direct mesh: the peers' NV# add up; through NVSwitch each peer shows all of them
            gpu.nvlinks_active = sum(counts) if sum(counts) <= MAX_NVLINKS else max(counts)
    legend = {int(m.group(1)): m.group(2) for line in lines if (m := NIC_LEGEND.match(line))}
    topo.nics = [legend.get(int(r[3:]), r) for r in nic_rows] or [c for c in names if c.startswith("NIC")]
    return topo


def _pair(a: int, b: int, cell: str) -> GpuPair | None:
    nv = NV_CELL.match(cell)
    if nv:
        return GpuPair(a=min(a, b), b=max(a, b), path=LinkPath.NVLINK, nvlinks=int(nv.group(1)))
    path = PATH_WORDS.get(cell)
    return None if path is None else GpuPair(a=min(a, b), b=max(a, b), path=path)


def read_nvlink_status(text: str) -> Topology:
    """Each GPU's NVLinks up and down and one link's rate, from ``nvidia-smi nvlink -s``."""
    topo = Topology(sources=["nvidia-smi nvlink -s"])
    current: GpuLinks | None = None
    for line in text.splitlines():
        gpu = SMI_GPU.match(line)
        if gpu:
            if len(topo.gpus) >= MAX_GPUS:
                break
            current = GpuLinks(index=int(gpu.group(1)), name=gpu.group(2).strip(), nvlinks_active=0)
            current.nvlinks_inactive = 0
            topo.gpus.append(current)
            continue
        link = SMI_LINK.match(line)
        if link and current is not None:
            if link.group(2) is None:
                current.nvlinks_inactive = (current.nvlinks_inactive or 0) + 1
            else:
                current.nvlinks_active = (current.nvlinks_active or 0) + 1
                rate = float(link.group(2))
                current.nvlink_gbps = max(current.nvlink_gbps or 0.0, rate)
    return topo


def merge_topology(into: Topology | None, other: Topology | None) -> Topology | None:
    """``other``'s facts added to ``into``'s: a GPU's field another source left unread is filled, a pair
    already known keeps its path (the first source read wins; sources are listed in the order read)."""
    if other is None:
        return into
    if into is None:
        return other
    into.sources += [s for s in other.sources if s not in into.sources]
    by_index = {g.index: g for g in into.gpus}
    counts_links = bool(other.sources) and other.sources[0] != "nvidia-smi topo -m"
    for gpu in other.gpus:
        mine = by_index.get(gpu.index)
        if mine is None:
            into.gpus.append(gpu)
            by_index[gpu.index] = gpu
            continue
        for key, value in vars(gpu).items():
            if value is not None and getattr(mine, key) is None:
                setattr(mine, key, value)
            elif key in ("nvlinks_active", "nvlinks_inactive") and value is not None and counts_links:
                # topo -m's NV# is what pairs bond; nvlink -s / NVML count each link: theirs wins
                setattr(mine, key, value)
    pairs = {(p.a, p.b): p for p in into.pairs}
    for pair in other.pairs:
        known = pairs.get((pair.a, pair.b))
        if known is None:
            into.pairs.append(pair)
            pairs[(pair.a, pair.b)] = pair
        elif known.p2p is None and pair.p2p is not None:
            known.p2p = pair.p2p
    into.gpus.sort(key=lambda g: g.index)
    into.nics += [n for n in other.nics if n not in into.nics]
    into.nccl_intra += [t for t in other.nccl_intra if t not in into.nccl_intra]
    into.nccl_inter += [t for t in other.nccl_inter if t not in into.nccl_inter]
    for key in ("nccl_net", "nccl_nodes", "nccl_ranks", "nccl_version"):
        if getattr(into, key) is None:
            setattr(into, key, getattr(other, key))
    return into


def describe(topology: Topology, gpu_name: str | None = None) -> str:
    """One line for the report's notes: the GPUs' paths, their NVLinks and PCIe links, the NICs, NCCL's choice."""
    parts: list[str] = []
    if topology.pairs:
        kinds = sorted({str(p.path) + (str(p.nvlinks) if p.nvlinks else "") for p in topology.pairs})
        gpus = len({p.a for p in topology.pairs} | {p.b for p in topology.pairs})
        parts.append(f"{gpus} GPUs, paths between them {', '.join(kinds)}")
    up = [g.nvlinks_active for g in topology.gpus if g.nvlinks_active]
    down = sum(g.nvlinks_inactive or 0 for g in topology.gpus)
    rates = {g.nvlink_gbps for g in topology.gpus if g.nvlink_gbps}
    if up:
        rate = f" at {min(rates):g} GB/s each" if rates else ""
        count = f"{min(up)}" if min(up) == max(up) else f"{min(up)}–{max(up)}"
        parts.append(f"{count} NVLinks up per GPU{rate}" + (f", {down} down" if down else ""))
    pcie = sorted(
        {(g.pcie_gen, g.pcie_width, g.pcie_gen_max, g.pcie_width_max) for g in topology.gpus if g.pcie_gen}
    )
    for gen, width, gen_max, width_max in pcie:
        parts.append(f"PCIe Gen{gen} x{width} (max Gen{gen_max} x{width_max})")
    if topology.nics:
        shown = ", ".join(topology.nics[:4]) + (
            f" … ({len(topology.nics)})" if len(topology.nics) > 4 else ""
        )
        parts.append(f"NICs {shown}")
    if topology.nccl_intra or topology.nccl_inter or topology.nccl_net:
        said = "/".join(topology.nccl_intra) or "no channel inside a node"
        net = f", between nodes {'/'.join(topology.nccl_inter)}" if topology.nccl_inter else ""
        parts.append(f"NCCL: {said} inside a node{net}, network {topology.nccl_net or 'none'}")
    c = ceiling(topology, gpu_name, None)
    if c is not None:
        parts.append(f"all-reduce ceiling ~{c.busbw_gbps:.0f} GB/s bus bandwidth ({c.link.key})")
    return f"links ({', '.join(topology.sources)}): " + "; ".join(parts)
