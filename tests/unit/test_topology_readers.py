"""The readers of where a machine's links are written: ``nvidia-smi topo -m`` / ``nvlink -s``, NCCL's init log
(alone and inside a training log), NVML through a recorded pynvml-shaped object, and the runner's NCCL logging.
Every input is recorded text in the tools' own layouts (tests/fixtures/links)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from pitstop.core.profile import Environment, GpuLinks, LinkPath, RankProfile, RunProfile, Topology
from pitstop.ingest.detect import sniff
from pitstop.ingest.load import Inputs, load_run
from pitstop.ingest.logs import read_log
from pitstop.ingest.nccl_log import read_nccl_text, transport_word
from pitstop.ingest.topology import merge_topology, read_nvlink_status, read_topo_matrix
from pitstop.interconnect import Fault, ceiling, scaling_bound
from pitstop.probe.collectors.links import job_indices, read_links
from pitstop.runner.nccl import nccl_log_env, read_nccl_logs, visible_gpus

LINKS = Path(__file__).parents[1] / "fixtures" / "links"


def _text(name: str) -> str:
    return (LINKS / name).read_text()


def test_topo_matrix_of_an_nvswitch_box_with_tabs() -> None:
    t = read_topo_matrix(_text("topo_h100_sxm_8x.txt"))
    assert len(t.pairs) == 28 and {(p.path, p.nvlinks) for p in t.pairs} == {(LinkPath.NVLINK, 18)}
    assert [g.index for g in t.gpus] == list(range(8))
    assert {g.nvlinks_active for g in t.gpus} == {18}  # NV18 to every peer through NVSwitch: 18, not 7 × 18
    assert t.nics == [f"mlx5_{i}" for i in range(10)]  # named by the NIC legend, NIC rows not taken for GPUs


def test_topo_matrix_of_a_pcie_box_pasted_with_spaces() -> None:
    t = read_topo_matrix(_text("topo_a100_pcie_4x.txt"))
    paths = {(p.a, p.b): p.path for p in t.pairs}
    assert paths == {
        (0, 1): LinkPath.PIX,
        (0, 2): LinkPath.SYS,
        (0, 3): LinkPath.SYS,
        (1, 2): LinkPath.SYS,
        (1, 3): LinkPath.SYS,
        (2, 3): LinkPath.PXB,
    }
    assert t.nics == ["mlx5_0", "mlx5_1"] and all(g.nvlinks_active is None for g in t.gpus)


def test_topo_matrix_with_terminal_underlines_and_phb() -> None:
    # two consumer cards on one root complex, as nvidia-smi writes to a terminal (header underlined)
    text = (
        "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
        "GPU0\t X \tPHB\t0-63\t0\t\tN/A\nGPU1\tPHB\t X \t0-63\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n"
        "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
    )
    t = read_topo_matrix(text)
    assert [(p.a, p.b, p.path) for p in t.pairs] == [(0, 1, LinkPath.PHB)] and t.nics == []


def test_nvlink_status_rates_and_inactive_links() -> None:
    h100 = read_nvlink_status(_text("nvlink_h100_8x.txt"))
    assert len(h100.gpus) == 8 and h100.gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert {(g.nvlinks_active, g.nvlinks_inactive, g.nvlink_gbps) for g in h100.gpus} == {(18, 0, 26.562)}
    v100 = read_nvlink_status(_text("nvlink_v100_inactive.txt"))
    assert [(g.nvlinks_active, g.nvlinks_inactive) for g in v100.gpus] == [(6, 0)] * 3 + [(4, 2)]
    pcie = read_nvlink_status("GPU 0: NVIDIA L40S (UUID: GPU-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901)\n")
    assert pcie.gpus[0].nvlinks_active == 0 and pcie.gpus[0].name == "NVIDIA L40S"


@pytest.mark.parametrize(
    ("name", "intra", "inter", "net", "nodes", "ranks"),
    [
        ("nccl_h100_nvlink.log", ["P2P/CUMEM"], [], "IB", 1, 8),
        ("nccl_a100_pcie_shm.log", ["P2P/IPC", "SHM"], [], "Socket", 1, 4),
        ("nccl_two_nodes_ib.log", ["P2P/CUMEM"], ["NET/IB"], "IB", 2, 4),
        ("nccl_two_nodes_socket.log", ["P2P/CUMEM"], ["NET/Socket"], "Socket", 2, 4),
    ],
)
def test_nccl_init_logs(
    name: str, intra: list[str], inter: list[str], net: str, nodes: int, ranks: int
) -> None:
    t = read_nccl_text(_text(name)).topology()
    assert t is not None
    assert (t.nccl_intra, t.nccl_inter, t.nccl_net, t.nccl_nodes, t.nccl_ranks) == (
        intra,
        inter,
        net,
        nodes,
        ranks,
    )


def test_nccl_versions_and_transport_words() -> None:
    assert read_nccl_text(_text("nccl_a100_pcie_shm.log")).version == "2.18.3"  # the bare line of older NCCL
    assert read_nccl_text(_text("nccl_h100_nvlink.log")).version == "2.21.5"
    assert transport_word("NET/IBext_v8/3/GDRDMA") == "NET/IB"  # an IB plugin is still InfiniBand
    assert transport_word("P2P/direct pointer/read") == "P2P/direct pointer"
    assert transport_word("SHM/direct/direct") == "SHM"
    assert transport_word("NET/AWS Libfabric/0/GDRDMA") == "NET/AWS Libfabric"
    assert read_nccl_text("no NCCL here\n").topology() is None


def test_nccl_lines_inside_a_training_log(tmp_path: Path) -> None:
    socket_lines = _text("nccl_two_nodes_socket.log").splitlines()
    log = tmp_path / "train.log"
    body = [f"[rank{i % 4}]:{line}" for i, line in enumerate(socket_lines)]
    body += ["{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.1}"] * 3
    log.write_text("\n".join(body) + "\n")
    assert sniff(log)[0] == "training_log"
    links = read_log(log).env.links
    assert links is not None and links.nccl_inter == ["NET/Socket"] and links.nccl_nodes == 2


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("topo_h100_sxm_8x.txt", "nvidia_smi_topo"),
        ("topo_a100_pcie_4x.txt", "nvidia_smi_topo"),
        ("nvlink_h100_8x.txt", "nvidia_smi_nvlink"),
        ("nvlink_v100_inactive.txt", "nvidia_smi_nvlink"),
        ("nccl_h100_nvlink.log", "nccl_log"),
        ("nccl_two_nodes_socket.log", "nccl_log"),
    ],
)
def test_sniff_knows_each_artifact(name: str, kind: str) -> None:
    assert sniff(LINKS / name)[0] == kind


def test_analyze_merges_the_sources_and_notes_the_ceiling() -> None:
    files = [LINKS / n for n in ("topo_h100_sxm_8x.txt", "nvlink_h100_8x.txt", "nccl_h100_nvlink.log")]
    run = load_run(Inputs(paths=files))
    links = run.environment.links
    assert links is not None
    assert links.sources == ["nvidia-smi topo -m", "nvidia-smi nvlink -s", "nccl log"]
    assert {g.nvlink_gbps for g in links.gpus} == {26.562} and links.nccl_intra == ["P2P/CUMEM"]
    note = next(n for n in run.notes if n.startswith("links ("))
    assert "NV18" in note and "all-reduce ceiling ~382 GB/s" in note  # 18 × 26.562 GB/s × 80%


def test_links_round_trip_through_the_profile_document() -> None:
    topo = merge_topology(
        read_topo_matrix(_text("topo_a100_pcie_4x.txt")),
        read_nccl_text(_text("nccl_a100_pcie_shm.log")).topology(),
    )
    assert topo is not None
    topo.gpus[1].pcie_gen, topo.gpus[1].pcie_width, topo.gpus[1].pcie_read_busy = 4, 8, True
    run = RunProfile(source="doctor", ranks=[RankProfile(environment=Environment(links=topo))])  # type: ignore[arg-type]
    back = RunProfile.from_dict(run.to_dict()).ranks[0].environment.links
    assert back == topo and isinstance(back.pairs[0].path, LinkPath)


def test_ceiling_reads_faults_from_the_links() -> None:
    h100 = merge_topology(
        read_topo_matrix(_text("topo_h100_sxm_8x.txt")), read_nvlink_status(_text("nvlink_h100_8x.txt"))
    )
    c = ceiling(h100, None, None)
    assert (
        c is not None
        and c.kind == "nvlink"
        and c.faults == ()
        and c.busbw_gbps == pytest.approx(382.5, abs=0.1)
    )
    down = ceiling(read_nvlink_status(_text("nvlink_v100_inactive.txt")), None, None)
    assert down is not None and down.faults == (Fault.NVLINK_DOWN,) and down.link.gbps < down.healthy.gbps  # type: ignore[union-attr]
    sock = ceiling(
        read_nccl_text(_text("nccl_two_nodes_socket.log")).topology(), "NVIDIA H100 80GB HBM3", None
    )
    assert sock is not None and sock.kind == "network" and sock.faults == (Fault.SOCKET,)
    ib = ceiling(read_nccl_text(_text("nccl_two_nodes_ib.log")).topology(), "NVIDIA H100 80GB HBM3", None)
    assert ib is not None and ib.faults == () and ib.link.key == "ib_ndr"
    pcie = ceiling(read_topo_matrix(_text("topo_a100_pcie_4x.txt")), "NVIDIA A100-PCIE-40GB", None)
    assert (
        pcie is not None and pcie.kind == "pcie_sys" and pcie.faults == ()
    )  # SHM across SYS is NCCL's normal
    idle = Topology(
        sources=["nvml"], gpus=[GpuLinks(0, pcie_gen=1, pcie_gen_max=4, pcie_width=16, pcie_width_max=16)]
    )
    assert ceiling(idle, None, None).faults == ()  # type: ignore[union-attr]  # an idle read: Gen1 is power saving
    assert scaling_bound(8, 0.2, 0.4) == (pytest.approx(4.0), pytest.approx(8 * 0.2 / 0.6))


class NvmlError(Exception):
    """pynvml's NVMLError: raised for a link the GPU does not have, a call the GPU or driver refuses."""


class _Pci:
    def __init__(self, bus: str) -> None:
        self.busId = bus.encode()


class RecordedTopologyNvml:
    """pynvml's topology calls answered from a recording (values as NVML returns them on the machine named)."""

    def __init__(
        self,
        gpus: list[dict[str, Any]],
        p2p: dict[tuple[int, int], int],
        ancestor: dict[tuple[int, int], int],
    ):
        self.gpus, self.p2p, self.ancestor = gpus, p2p, ancestor

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.gpus[h]["name"].encode()

    def nvmlDeviceGetPciInfo(self, h: int) -> _Pci:
        return _Pci(self.gpus[h]["bus"])

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        links = self.gpus[h].get("links", [])
        if link >= len(links):
            raise NvmlError("Not Supported")
        return 1 if links[link] else 0

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, h: int, link: int) -> _Pci:
        return _Pci(self.gpus[h]["links"][link])

    def _field(self, h: int, key: str) -> int:
        if key not in self.gpus[h]:
            raise NvmlError("Not Supported")
        return int(self.gpus[h][key])

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._field(h, "gen")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self._field(h, "gen_max")

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._field(h, "width")

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self._field(h, "width_max")

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        return self.p2p[(a, b)]

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return self.ancestor[(a, b)]


def test_nvml_reader_on_a_pcie_box_with_a_narrow_slot() -> None:
    # 4 L40S on two sockets; GPU 2 sits in a slot wired x8; no NVLink (every link index raises); P2P refused
    # by the driver (NVML_P2P_STATUS_NOT_SUPPORTED = 5), common ancestors SINGLE (10) and SYSTEM (50)
    gpus = [
        {
            "name": "NVIDIA L40S",
            "bus": f"00000000:{b}:00.0",
            "gen": 4,
            "gen_max": 4,
            "width": w,
            "width_max": 16,
        }
        for b, w in (("17", 16), ("31", 16), ("b1", 8), ("ca", 16))
    ]
    pairs = [(a, b) for a in range(4) for b in range(a + 1, 4)]
    nvml = RecordedTopologyNvml(
        gpus, {p: 5 for p in pairs}, {p: 10 if p in ((0, 1), (2, 3)) else 50 for p in pairs}
    )
    t = read_links(nvml)
    assert t is not None and t.sources == ["nvml"]
    assert [(g.pcie_gen, g.pcie_width, g.pcie_width_max) for g in t.gpus][2] == (4, 8, 16)
    assert all(g.nvlinks_active is None and g.pcie_read_busy for g in t.gpus)
    assert {(p.a, p.b): (p.path, p.p2p) for p in t.pairs}[(0, 1)] == (LinkPath.PIX, False)
    assert {(p.a, p.b): p.path for p in t.pairs}[(1, 2)] == LinkPath.SYS
    c = ceiling(t, "NVIDIA L40S", None)
    assert c is not None and Fault.PCIE_WIDTH in c.faults and "GPU 2: PCIe x8 of x16" in c.fault_notes


def test_nvml_reader_on_an_nvswitch_box_and_a_refusing_driver() -> None:
    switches = [
        f"00000000:{s}:00.0" for s in ("c1", "c2", "c3", "c4")
    ]  # 4 NVSwitches, links spread over them
    gpus = [
        {"name": "NVIDIA H100 80GB HBM3", "bus": f"00000000:{b}:00.0", "gen": 5, "gen_max": 5, "width": 16,
         "width_max": 16, "links": [switches[i % 4] for i in range(18)]}
        for b in ("18", "2a", "3a", "5d")
    ]  # fmt: skip
    gpus[3]["links"][7] = None  # one link down
    pairs = [(a, b) for a in range(4) for b in range(a + 1, 4)]
    t = read_links(RecordedTopologyNvml(gpus, {p: 0 for p in pairs}, {p: 50 for p in pairs}))
    assert t is not None
    assert [(g.nvlinks_active, g.nvlinks_inactive) for g in t.gpus] == [(18, 0)] * 3 + [(17, 1)]
    assert all(p.path == LinkPath.NVLINK and p.p2p for p in t.pairs)

    class Refusing:  # a driver that answers nothing past the count
        def nvmlDeviceGetCount(self) -> int:
            return 2

        def __getattr__(self, name: str) -> Any:
            def refuse(*args: Any) -> Any:
                raise NvmlError("Unknown Error")

            return refuse

    assert read_links(Refusing()) is None
    assert (
        job_indices("2,3") == [2, 3] and job_indices("GPU-abc,GPU-def") is None and job_indices(None) is None
    )


def test_runner_asks_nccl_to_log_only_on_several_gpus_and_never_over_the_users(tmp_path: Path) -> None:
    env = nccl_log_env({}, tmp_path, gpus=8)
    assert env == {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        "NCCL_DEBUG_FILE": str(tmp_path / "nccl.%h.%p.log"),
    }
    assert nccl_log_env({}, tmp_path, gpus=1) == {}
    assert nccl_log_env({"NCCL_DEBUG": "WARN"}, tmp_path, gpus=8) == {}
    assert nccl_log_env({"NCCL_DEBUG_FILE": "/tmp/mine.%p"}, tmp_path, gpus=8) == {}
    driver = tmp_path / "gpus"
    for bus in ("0000:17:00.0", "0000:31:00.0", "0000:b1:00.0"):
        (driver / bus).mkdir(parents=True)
    assert visible_gpus({}, driver) == 3
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1"}, driver) == 1
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, driver) == 0
    assert visible_gpus({}, tmp_path / "no-driver") == 0


def test_runner_reads_nccls_files_from_its_folder(tmp_path: Path) -> None:
    lines = _text("nccl_two_nodes_ib.log").splitlines()
    (tmp_path / "nccl.node-a.5100.log").write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    (tmp_path / "nccl.node-a.5101.log").write_text("\n".join(lines[len(lines) // 2 :]) + "\n")
    t = read_nccl_logs(tmp_path)
    assert t is not None and t.nccl_inter == ["NET/IB"] and t.nccl_net == "IB"
    assert read_nccl_logs(tmp_path / "empty") is None


def test_the_probe_reads_the_links_once_on_a_cuda_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from pitstop.probe.collectors.links import LinksCollector

    gpus = [
        {
            "name": "NVIDIA L40S",
            "bus": f"00000000:{b}:00.0",
            "gen": 4,
            "gen_max": 4,
            "width": 16,
            "width_max": 16,
        }
        for b in ("17", "31")
    ]
    calls: list[str] = []
    nvml = RecordedTopologyNvml(gpus, {(0, 1): 0}, {(0, 1): 10})
    nvml.nvmlInit = lambda: calls.append("init")  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    ctx = SimpleNamespace(on_cuda=True, config=SimpleNamespace(nvml_replay=None), errors=[])
    collector = LinksCollector(ctx)
    collector.stop_window()
    collector.stop_window()  # idempotent: read once
    draft = RankProfile(environment=Environment())
    collector.fill(draft)
    links = draft.environment.links
    assert calls == ["init", "shutdown"] and links is not None and links.sources == ["nvml"]
    assert [(p.a, p.b, p.path, p.p2p) for p in links.pairs] == [(0, 1, LinkPath.PIX, True)]
    monkeypatch.setenv("LOCAL_RANK", "1")  # another process of the node: the first one reads it
    other = LinksCollector(ctx)
    other.stop_window()
    assert other.links is None and calls == ["init", "shutdown"]
    cpu = LinksCollector(SimpleNamespace(on_cuda=False, config=SimpleNamespace(nvml_replay=None), errors=[]))
    cpu.stop_window()
    assert cpu.links is None
