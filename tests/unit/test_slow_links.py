"""slow_links: the links (not a setting) cap the job. The rule on profiles whose links come from recorded tool
output (tests/fixtures/links) and whose communication is timed (three ranks, one 100 MB all-reduce a step);
``pitstop analyze`` on the recorded artifacts; a real gloo job under ``pitstop doctor -- torchrun``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tests.conftest import SCRIPTS, causes, doctor
from tests.unit.test_ranks import _profile

from pitstop.core.findings import Finding
from pitstop.core.profile import GpuLinks, GpuPair, LinkPath, RunProfile, Topology
from pitstop.core.vocabulary import CauseId, Device, Framework, RemedyId
from pitstop.diagnose import diagnose
from pitstop.diagnose.causes.slow_links import ASSUMED_CONFIDENCE, MEASURED_CONFIDENCE, PLANNED_CONFIDENCE
from pitstop.ingest.load import Inputs, load_run
from pitstop.ingest.nccl_log import read_nccl_text
from pitstop.ingest.topology import merge_topology, read_nvlink_status, read_topo_matrix
from pitstop.remedies import REGISTRY

LINKS = Path(__file__).parents[1] / "fixtures" / "links"


def _read(*names: str) -> Topology:
    topo: Topology | None = None
    for name in names:
        text = (LINKS / name).read_text()
        if name.startswith("topo_"):
            part = read_topo_matrix(text)
        elif name.startswith("nvlink_"):
            part = read_nvlink_status(text)
        else:
            part = read_nccl_text(text).topology()  # type: ignore[assignment]
        topo = merge_topology(topo, part)
    assert topo is not None
    return topo


def _run(gpu: str, links: Topology | None, transfer_s: float = 0.04) -> RunProfile:
    """Three ranks, 100 ms steps, ``transfer_s`` of them moving a 100 MB all-reduce after the last arrival."""
    run = _profile(None, 0.0, transfer_s)
    for rank in run.ranks:
        rank.environment.gpu_name = gpu
        rank.environment.links = links
    return run


def _found(run: RunProfile) -> dict[str, Finding]:
    return {str(f.cause): f for f in diagnose(run).findings}


def test_a_pcie_box_with_a_real_share_of_communication() -> None:
    found = _found(_run("NVIDIA A100-PCIE-40GB", _read("topo_a100_pcie_4x.txt", "nccl_a100_pcie_shm.log")))
    f = found["slow_links"]
    ev = f.evidence
    assert ev["reason"] == "pcie_only" and ev["link_kind"] == "pcie_sys" and ev["links_read"] is True
    assert ev["ceiling_busbw_gbps"] == pytest.approx(12.6)  # PCIe 4.0 x16 × ½ across sockets × 80%
    assert ev["gpu_paths"] == ["PIX", "PXB", "SYS"] and ev["nccl_transports"] == ["P2P/IPC", "SHM"]
    assert ev["exposed_frac_of_step"] == pytest.approx(0.4, abs=1e-3)
    assert ev["measured_busbw_gbps"] == pytest.approx(3.33, abs=0.01)
    # 100 MB × 2·2/3 on the bus at 12.6 GB/s: 10.6 ms against 60 ms of compute; 3 GPUs at most ×3 hidden
    assert ev["comm_s_per_step_at_ceiling"] == pytest.approx(0.1333 / 12.6, abs=1e-4)
    assert ev["scaling_at_most"] == pytest.approx(3.0) and ev["scaling_without_overlap"] < 2.6
    assert f.confidence == MEASURED_CONFIDENCE and f.severity == "high"
    assert f.est_speedup == pytest.approx(1 / 0.6, rel=1e-3) and "1/(1−f)" in f.speedup_basis
    assert [u.remedy for u in f.fix.uses] == [RemedyId.COMMUNICATE_LESS]
    assert "~13 GB/s" in f.summary and "3 GPUs give at most ×3.0" in f.summary
    assert "not a setting" in f.summary
    comm = found["communication_bound"]  # the symptom names the links as its reason
    assert comm.evidence["slow_links"] == "pcie_only" and "slow_links" in comm.evidence["likely_causes"]


def test_an_nvlink_box_is_not_slow_links_and_communication_bound_is_unchanged() -> None:
    links = _read("topo_h100_sxm_8x.txt", "nvlink_h100_8x.txt", "nccl_h100_nvlink.log")
    found = _found(_run("NVIDIA H100 80GB HBM3", links))
    assert "slow_links" not in found
    comm = found["communication_bound"]  # 3.3 GB/s on NVLink: a transport problem, as before
    assert "transport" in comm.evidence["likely_causes"] and "slow_links" not in comm.evidence


def test_nodes_over_sockets_name_the_fallback_and_the_transport_fix() -> None:
    found = _found(_run("NVIDIA H100 80GB HBM3", _read("nccl_two_nodes_socket.log")))
    f = found["slow_links"]
    assert f.evidence["reason"] == "socket" and f.evidence["link"] == "eth100"
    assert f.evidence["nccl_transports"] == ["P2P/CUMEM", "NET/Socket"] and f.evidence["nccl_net"] == "Socket"
    assert f.evidence["healthy_busbw_gbps"] == pytest.approx(40.0)  # one NDR NIC per GPU
    # the exposed 40% at a quarter of the time on InfiniBand: 1 / (0.6 + 0.1)
    assert f.est_speedup == pytest.approx(1 / 0.7, rel=1e-3)
    remedies = [u.remedy for u in f.fix.uses]
    assert remedies == [RemedyId.FIX_TRANSPORT, RemedyId.COMMUNICATE_LESS]
    assert "NET/Socket" in f.fix.text and "ibv_devinfo" in f.fix.snippets["pytorch"]
    comm = found["communication_bound"]
    assert comm.evidence["slow_links"] == "socket"
    assert RemedyId.FIX_TRANSPORT not in [u.remedy for u in comm.fix.uses]


def test_nodes_on_infiniband_do_not_fire() -> None:
    assert "slow_links" not in _found(_run("NVIDIA H100 80GB HBM3", _read("nccl_two_nodes_ib.log")))


def test_shm_between_nvlinked_gpus_is_a_transport_fault() -> None:
    links = _read("topo_h100_sxm_8x.txt")
    links.nccl_intra = ["SHM"]
    f = _found(_run("NVIDIA H100 80GB HBM3", links))["slow_links"]
    assert f.evidence["reason"] == "shm"
    assert next(u.remedy for u in f.fix.uses) == RemedyId.FIX_TRANSPORT
    assert "--ipc=host" in f.fix.snippets["pytorch"]


def test_a_narrow_pcie_slot_read_by_nvml() -> None:
    gpus = [GpuLinks(i, "NVIDIA L40S", None, None, None, 4, 4, 16, 16, True) for i in range(3)]
    gpus[2].pcie_width = 4
    pairs = [
        GpuPair(0, 1, LinkPath.PIX, p2p=False),
        GpuPair(0, 2, LinkPath.NODE),
        GpuPair(1, 2, LinkPath.NODE),
    ]
    f = _found(_run("NVIDIA L40S", Topology(sources=["nvml"], gpus=gpus, pairs=pairs)))["slow_links"]
    assert f.evidence["reason"] == "pcie_width" and f.evidence["faults"] == ["GPU 2: PCIe x4 of x16"]
    assert f.evidence["link"] == "pcie4x4" and f.evidence["healthy_busbw_gbps"] == pytest.approx(
        25.2, abs=0.1
    )
    assert f.est_speedup == pytest.approx(
        1 / (0.6 + 0.4 / 4), rel=1e-3
    )  # x16 moves it in a quarter of the time
    assert "full x16 slot" in f.fix.text


def test_a_pcie_card_by_its_name_alone_is_less_sure() -> None:
    f = _found(_run("NVIDIA L40S", None))["slow_links"]
    assert f.evidence["links_read"] is False and f.evidence["link"] == "pcie4x16"
    assert f.confidence == ASSUMED_CONFIDENCE < MEASURED_CONFIDENCE


def test_little_communication_on_pcie_or_a_cpu_gloo_job_does_not_fire() -> None:
    quiet = _found(_run("NVIDIA A100-PCIE-40GB", _read("topo_a100_pcie_4x.txt"), transfer_s=0.004))
    assert "slow_links" not in quiet  # 4% of a step: the links are not what holds the job
    gloo = _profile(None, 0.0, 0.04, clock="host")
    for rank in gloo.ranks:
        env = rank.environment
        env.device, env.dist_backend, env.gpu_name = Device.CPU, "gloo", None
    assert "slow_links" not in _found(gloo)


def test_analyze_pcie_and_nvlink_boxes_side_by_side() -> None:
    model = LINKS / "llama-3.2-1b"
    pcie = load_run(
        Inputs(
            paths=[LINKS / "topo_a100_pcie_4x.txt", LINKS / "nccl_a100_pcie_shm.log"],
            gpu="A100-40GB",
            model=str(model),
        )
    )
    f = _found(pcie)["slow_links"]
    ev = f.evidence
    # DDP of 1.24 B bf16 gradients over NCCL's 4 ranks: 2·3/4 × 2.47 GB through each link at 12.6 GB/s
    assert ev["gpus"] == 4 and ev["gpus_from"] == "NCCL's communicator"
    assert ev["gb_on_the_bus_per_step"] == pytest.approx(1.5 * 2 * 1_235_814_400 / 1e9, abs=1e-3)
    assert ev["comm_s_per_step_at_ceiling"] == pytest.approx(0.2942, abs=1e-3)
    assert f.confidence == PLANNED_CONFIDENCE and f.est_speedup is None and f.severity == "low"
    nvlink = load_run(
        Inputs(
            paths=[LINKS / n for n in ("topo_h100_sxm_8x.txt", "nvlink_h100_8x.txt", "nccl_h100_nvlink.log")],
            gpu="H100-SXM",
            model=str(model),
        )
    )
    assert "slow_links" not in _found(nvlink)


def test_the_remedy_speaks_each_framework() -> None:
    remedy = REGISTRY[RemedyId.COMMUNICATE_LESS]
    params = {"reason": "pcie_only", "busbw_gbps": 12.6, "link": "pcie4x16"}
    assert "HYBRID_SHARD" in remedy.advice(Framework.PYTORCH, params).text
    assert "zero_hpz_partition_size" in remedy.advice(Framework.DEEPSPEED, params).snippet
    assert "bf16_compress_hook" in remedy.advice(Framework.LIGHTNING, params).snippet
    assert "gradient_accumulation_steps" in remedy.advice(Framework.HF_TRAINER, params).snippet
    assert remedy.advice(Framework.PYTORCH, {"reason": "pcie_gen"}).text.startswith("First the link itself")
    assert CauseId.SLOW_LINKS.value == "slow_links"


@pytest.mark.slow
def test_a_gloo_job_under_doctor_gets_no_nccl_settings_and_no_slow_links(tmp_path: Path) -> None:
    """On a machine without GPUs the runner leaves NCCL's variables alone, and gloo gives slow_links nothing."""
    out = tmp_path / "env"
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2")
    doc, _ = doctor(tmp_path, *torchrun, str(SCRIPTS / "links_env.py"), str(out), steps=8)
    seen = [json.loads((tmp_path / f"env.rank{r}.json").read_text()) for r in (0, 1)]
    assert all("NCCL_DEBUG" not in s and "NCCL_DEBUG_FILE" not in s for s in seen)
    assert "slow_links" not in causes(doc)
    ranks = doc["profile"]["ranks"]
    assert len(ranks) == 2 and all(r["environment"]["links"] is None for r in ranks)  # no NVML, no NCCL log
