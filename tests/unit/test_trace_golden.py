"""Trace analysis against what the TensorBoard plugin and Holistic Trace Analysis report on the shared traces
(../shared/data/traces/REFERENCE.md), and the causes those tools themselves flagged."""

from __future__ import annotations

from pathlib import Path

import pytest

from pitstop.diagnose import diagnose
from pitstop.ingest.load import Inputs, load_run
from pitstop.trace import load_trace
from pitstop.trace.events import read_columns
from pitstop.trace.overview import overview

# trace: (avg step ms, Kernel, Memcpy, Runtime, DataLoader, CPU Exec, Other, GPU util, HTA idle, compute, non-compute)
REFERENCE = {
    "control": (77.5, 79.4, 4.0, 3.2, 0.1, 13.0, 0.1, 0.794, 16.2, 61.2, 22.6),
    "ns_resolution": (96.7, 96.8, 0.8, 0.8, 0.0, 1.3, 0.2, 0.968, 2.6, 96.8, 0.6),
    "nccl_data": (222.4, 23.3, 0.3, 4.5, 0.0, 71.6, 0.1, 0.233, 77.8, 17.3, 5.0),
    "negative_queue": (245.8, 32.2, 3.4, 52.4, 0.0, 11.0, 0.9, 0.322, 69.4, 14.2, 16.4),
    "mi250": (9.3, 1.2, 0.4, 72.1, 0.0, 20.5, 5.8, 0.012, 98.5, 1.1, 0.4),
}


def _trace(shared: Path, key: str) -> Path:
    return next(p for p in (shared / "traces").glob("*.gz") if key in p.name)


@pytest.mark.parametrize("key", sorted(REFERENCE))
def test_breakdown_matches_the_tensorboard_plugin(shared_data: Path, key: str) -> None:
    step, kernel, memcpy, runtime, dataloader, cpu, other, util, *_ = REFERENCE[key]
    view = overview(read_columns(_trace(shared_data, key)))
    shares = {k: 100 * v for k, v in view.shares().items()}
    assert view.mean_step_us / 1000 == pytest.approx(step, abs=0.05)
    for role, expected in (
        ("Kernel", kernel),
        ("Memcpy", memcpy),
        ("Runtime", runtime),
        ("DataLoader", dataloader),
        ("CPU Exec", cpu),
        ("Other", other),
    ):
        assert shares[role] == pytest.approx(expected, abs=2.0), role  # the bound: ±2 points
        assert shares[role] == pytest.approx(expected, abs=0.1), role  # what pitstop actually achieves
    assert sum(shares.values()) == pytest.approx(100.0, abs=0.01)
    assert next(iter(view.gpu_util.values())) == pytest.approx(util, abs=0.02)
    assert next(iter(view.gpu_util.values())) == pytest.approx(util, abs=0.001)


@pytest.mark.parametrize("key", sorted(REFERENCE))
def test_temporal_breakdown_matches_hta(shared_data: Path, key: str) -> None:
    *_, idle, compute, non_compute = REFERENCE[key]
    t = load_trace(_trace(shared_data, key)).trace
    assert t is not None
    assert t.temporal is not None and t.idle_split is not None
    assert 100 * t.temporal.idle == pytest.approx(idle, abs=2.0)
    assert 100 * t.temporal.idle == pytest.approx(idle, abs=0.1)
    assert 100 * t.temporal.compute == pytest.approx(compute, abs=0.15)
    assert 100 * t.temporal.non_compute == pytest.approx(non_compute, abs=0.15)
    split = t.idle_split
    assert split.host_wait + split.kernel_wait + split.other == pytest.approx(1.0, abs=1e-3)


def test_trace_facts(shared_data: Path) -> None:
    control = load_trace(_trace(shared_data, "control"))
    assert (control.rank, control.environment.world_size) == (3, 8)
    assert control.environment.gpu_name == "NVIDIA A100-PG509-200"
    t = control.trace
    assert t is not None
    assert t.dataloader_multiprocess is True
    assert t.nccl_ms == pytest.approx(27.26, abs=0.05)
    assert t.nccl_overlap_frac == pytest.approx(0.462, abs=0.005)
    assert t.tf32_gemm_frac is not None and t.tf32_gemm_frac > 0.5  # Ampere tensor-op s1688 GEMMs: TF32
    v100 = load_trace(_trace(shared_data, "ns_resolution")).trace
    assert v100 is not None and v100.fp32_gemm_frac == pytest.approx(1.0, abs=0.01)  # sgemm on a V100
    steps = load_trace(_trace(shared_data, "negative_queue")).steps  # host syncs are the steps' own fields
    assert sum(s.syncs or 0 for s in steps) / len(steps) == pytest.approx(188.8, abs=0.1)
    assert 1000 * sum(s.sync_s or 0.0 for s in steps) / len(steps) > 10  # ms blocked per step


def _causes(shared: Path, key: str) -> dict[str, str]:
    d = diagnose(load_run(Inputs(paths=[_trace(shared, key)])))
    return {f.cause: f.severity for f in d.findings}


def test_flags_what_the_reference_tools_flagged(shared_data: Path) -> None:
    # the plugin said "low GPU utilization: increase batch size" for these three
    for key in ("nccl_data", "negative_queue", "mi250"):
        assert "small_batch" in _causes(shared_data, key), key
    # and "enable AMP" for these two (fp32 GEMMs with no tensor-core use)
    for key in ("ns_resolution", "mi250"):
        assert _causes(shared_data, key).get("no_mixed_precision") == "high", key
    # a well-utilized V100 run gets no batch-size advice
    assert "small_batch" not in _causes(shared_data, "ns_resolution")


def test_flags_what_the_reference_tools_did_not_report(shared_data: Path) -> None:
    control = _causes(shared_data, "control")
    assert "communication_bound" in control  # 35% of the step in NCCL, 46% of it overlapped
    assert control.get("no_mixed_precision") == "medium"  # TF32, not bf16
    assert "host_sync" in _causes(shared_data, "negative_queue")  # 189 syncs / step, 13% of it blocked
