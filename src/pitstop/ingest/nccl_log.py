"""NCCL's own init log (``NCCL_DEBUG=INFO``): which network it opened and which transport each channel took,
read into a ``Topology``. It is the one place that says what NCCL chose, not what it could have chosen.

Every line NCCL writes starts ``host:pid:tid [cudaDev] NCCL INFO`` (a launcher may prefix ``[rank3]:``). Read:

* ``NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:10.0.0.1<0>`` and ``NET/Socket : Using
  [0]eth0:10.0.0.1<0>``: the devices of the network transport it opened; ``NET/IB : No device found.``;
* ``Using network IB`` / ``Using network Socket`` (or a plugin's name, ``AWS Libfabric``): the one it uses;
* ``Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read`` (``P2P/IPC``, ``P2P/direct pointer``, ``SHM/direct/direct``,
  ``[send] via NET/IB/0/GDRDMA``, ``via NET/Socket/0``; before 2.7 ``Ring 00 : ...``): each channel's transport;
* ``comm 0x… rank 0 nranks 16 … - Init START`` or ``… nRanks 16 nNodes 2 localRanks 8 …``: the communicator;
* ``NCCL version 2.21.5+cuda12.4``; ``NCCL_IB_DISABLE set by environment to 1.``: the settings NCCL saw.

A transport over ``NET`` runs between nodes; ``P2P`` and ``SHM`` inside one. The hosts in the line prefixes
count the nodes where the communicator line does not say."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pitstop.core.profile import Topology

PREFIX = re.compile(r"(?:^|\s|\]:)([\w.\-]{1,255}):(\d{1,10}):(\d{1,10}) \[(\d{1,5})\] NCCL (?:INFO|WARN) ")
VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
NET_USING = re.compile(r"NET/(IB|Socket) : Using ((?:\[\d+\][^\s;]+\s*)+)")
NET_DEVICE = re.compile(r"\[\d+\]([^:\s;]+)")
NET_NONE = re.compile(r"NET/IB : No device found")
USING_NETWORK = re.compile(r"Using network (.+?)\s*$")
CHANNEL = re.compile(
    r"(?:Channel|Ring) \d+(?:/\d+)? : \d+\[\w+\] -> \d+\[\w+\](?: \[\w+\])? via (\S+(?: pointer)?\S*)"
)
COMM = re.compile(r"comm 0x[0-9a-f]+ rank \d+ n[Rr]anks (\d+)(?: nNodes (\d+))?")
SETTING = re.compile(r"(NCCL_[A-Z0-9_]+) set by environment to (\S+?)\.?\s*$")
MAX_HOSTS = 100_000
NCCL_WORDS = ("NCCL INFO", "NCCL WARN", "NCCL version")


def looks_like_nccl(head: str) -> bool:
    """A file of NCCL's INFO lines (``NCCL_DEBUG_FILE``, or a job's output that holds little else)."""
    return sum(1 for line in head.splitlines()[:200] if PREFIX.search(line)) >= 3


def transport_word(via: str) -> str:
    """A channel's transport without its per-channel detail: ``P2P/CUMEM``, ``P2P/IPC``, ``SHM``,
    ``NET/IB`` (IB and RoCE, any IB plugin: ``IBext_v8``), ``NET/Socket``, or ``NET/<plugin>``."""
    parts = via.split("/")
    kind = parts[0]
    if kind == "NET" and len(parts) > 1:
        net = parts[1]
        return "NET/IB" if net.startswith("IB") else f"NET/{net}"
    if kind == "P2P" and len(parts) > 1:
        return f"P2P/{parts[1]}"
    return kind


@dataclass
class NcclReader:
    """Fed one line at a time (a training log holds NCCL's lines among its own), then ``topology()``."""

    intra: list[str] = field(default_factory=list)
    inter: list[str] = field(default_factory=list)
    net: str | None = None
    nics: list[str] = field(default_factory=list)
    ranks: int | None = None
    nodes: int | None = None
    version: str | None = None
    hosts: set[str] = field(default_factory=set)
    settings: dict[str, str] = field(default_factory=dict)
    lines: int = 0

    def feed(self, line: str) -> None:
        if not any(word in line for word in NCCL_WORDS):
            return
        version = VERSION.search(line)
        if version:
            self.version = self.version or version.group(1)
            return
        prefix = PREFIX.search(line)
        if prefix is None:
            return
        self.lines += 1
        if len(self.hosts) < MAX_HOSTS:
            self.hosts.add(prefix.group(1))
        body = line[prefix.end() :]
        channel = CHANNEL.search(body)
        if channel:
            word = transport_word(channel.group(1))
            target = self.inter if word.startswith("NET") else self.intra
            if word not in target:
                target.append(word)
            return
        using = NET_USING.search(body)
        if using:
            self.net = self.net or using.group(1)
            for device in NET_DEVICE.findall(using.group(2)):
                if device not in self.nics:
                    self.nics.append(device)
            return
        network = USING_NETWORK.search(body)
        if network:
            self.net = network.group(1)
            return
        comm = COMM.search(body)
        if comm:
            self.ranks = max(self.ranks or 0, int(comm.group(1)))
            if comm.group(2):
                self.nodes = max(self.nodes or 0, int(comm.group(2)))
            return
        setting = SETTING.search(body)
        if setting:
            self.settings[setting.group(1)] = setting.group(2)
            return
        if NET_NONE.search(body) and self.net is None:
            self.net = None

    def topology(self) -> Topology | None:
        """What the lines said; None when no NCCL line was read."""
        if not self.lines:
            return None
        nodes = self.nodes
        if nodes is None and self.hosts:
            nodes = len(self.hosts)
        return Topology(
            sources=["nccl log"],
            nics=list(self.nics),
            nccl_intra=list(self.intra),
            nccl_inter=list(self.inter),
            nccl_net=self.net,
            nccl_nodes=nodes,
            nccl_ranks=self.ranks,
            nccl_version=self.version,
        )


def read_nccl_text(text: str) -> NcclReader:
    reader = NcclReader()
    for line in text.splitlines():
        reader.feed(line)
    return reader
