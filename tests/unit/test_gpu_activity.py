"""The rules that read the GPUs' activity counters, on recorded-shape samples (DCGM's profiling fields as
``dcgmi dmon`` prints them and dcgm-exporter exports them): what each rule concludes, with which evidence,
and that nothing changes where no counters were read."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.factories import profile, steps

from pitstop.core.findings import Finding
from pitstop.core.profile import ActivitySample, GpuActivity, KernelFacts, RunProfile
from pitstop.diagnose import diagnose
from pitstop.diagnose.activity import read_activity
from pitstop.ingest.load import Inputs, load_run
from pitstop.remedies import RemedyId


def finding(p: RunProfile, cause: str) -> Finding | None:
    found = [f for f in diagnose(p).findings if f.cause == cause]
    return found[0] if found else None


def counters(
    p: RunProfile,
    sm: float | None = 0.35,
    occ: float | None = 0.12,
    tensor: float | None = 0.3,
    dram: float | None = 0.2,
    n: int = 20,
    unsupported: list[str] | None = None,
) -> RunProfile:
    """Every rank gets n one-second DCGM samples with these means (small jitter, as a real GPU reads), plus
    two idle samples at the start that the means must leave out."""
    for rank in p.ranks:
        idle = [ActivitySample(t=float(i), gr_active=0.0, sm_active=0.0, tensor_active=0.0) for i in range(2)]
        busy = [
            ActivitySample(
                t=float(i + 2),
                gr_active=0.97 + (i % 3) / 100,
                sm_active=None if sm is None else sm + (i % 2 - 0.5) / 50,
                sm_occupancy=None if occ is None else occ + (i % 2 - 0.5) / 100,
                tensor_active=None if tensor is None else max(0.0, tensor + (i % 2 - 0.5) / 500),
                dram_active=None if dram is None else dram,
                power_w=600.0,
            )
            for i in range(n)
        ]
        rank.gpu_activity = GpuActivity(
            source="dcgmi dmon", gpu=str(rank.rank), samples=idle + busy, unsupported=unsupported or []
        )
    return p


def test_means_leave_out_idle_samples_and_keep_what_was_na() -> None:
    act = read_activity(counters(profile("cuda", util=98.0), tensor=None, unsupported=["tensor_active"]))
    assert act is not None and act.samples == 20 and act.gpus == ["0"]
    assert act.get("sm_active") == pytest.approx(0.35, abs=0.01)
    assert act.get("tensor_active") is None and act.unsupported == ["tensor_active"]
    assert act.starved and not act.memory_bound and not act.tensor_idle
    assert read_activity(profile("cuda", util=98.0)) is None


# -- small_batch --------------------------------------------------------------------------------------------
def test_small_batch_from_empty_sms_while_utilization_reads_full() -> None:
    plain = profile("cuda", util=98.0, mem_frac=0.4)
    assert finding(plain, "small_batch") is None  # utilization alone says the GPU is full
    f = finding(counters(plain, sm=0.35, occ=0.12), "small_batch")
    assert f is not None
    assert f.evidence["sm_active"] == pytest.approx(0.35, abs=0.01)
    assert f.evidence["sm_occupancy"] == pytest.approx(0.12, abs=0.01)
    assert f.evidence["gpu_util"] == pytest.approx(0.98)
    assert f.confidence == pytest.approx(0.75)  # SM activity and occupancy agree
    assert "Utilization reads 98%" in f.summary and "SM active 35%" in f.summary
    assert f.est_speedup == pytest.approx(0.8 / 0.35, rel=0.05)
    assert f.fix.uses[0].remedy is RemedyId.MICRO_BATCH


def test_small_batch_quiet_when_the_sms_are_full_or_memory_is() -> None:
    assert finding(counters(profile("cuda", util=98.0), sm=0.85, occ=0.6), "small_batch") is None
    assert finding(counters(profile("cuda", util=98.0, mem_frac=0.95)), "small_batch") is None


def test_small_batch_confidence_rises_when_the_counters_agree_with_low_utilization() -> None:
    low = finding(profile("cuda", util=40.0, mem_frac=0.3), "small_batch")
    agreed = finding(counters(profile("cuda", util=40.0, mem_frac=0.3), sm=0.3), "small_batch")
    assert low is not None and agreed is not None
    assert agreed.confidence == pytest.approx(low.confidence + 0.15)
    assert agreed.evidence["sm_active"] == pytest.approx(0.3, abs=0.01)
    assert "sm_active" not in low.evidence


# -- host_sync ----------------------------------------------------------------------------------------------
def test_host_sync_found_behind_a_full_utilization_by_the_counters() -> None:
    synced = steps(syncs=4, sync_s=0.01)
    assert finding(profile("cuda", synced, util=99.0), "host_sync") is None  # as before: utilization 99%
    f = finding(counters(profile("cuda", synced, util=99.0), sm=0.4), "host_sync")
    assert f is not None and f.confidence == pytest.approx(0.8)
    assert f.evidence["sm_active"] == pytest.approx(0.4, abs=0.01) and f.evidence["syncs_per_step"] == 4
    assert "counters agree" in f.summary
    plain = finding(profile("cuda", synced, util=70.0), "host_sync")
    assert plain is not None and plain.confidence == pytest.approx(0.7)


# -- no_mixed_precision -------------------------------------------------------------------------------------
def test_no_mixed_precision_confirmed_by_idle_tensor_pipes() -> None:
    fp32 = dict(param_dtype="fp32", tf32=False)
    before = finding(profile("cuda", util=95.0, **fp32), "no_mixed_precision")
    after = finding(counters(profile("cuda", util=95.0, **fp32), sm=0.8, tensor=0.004), "no_mixed_precision")
    assert before is not None and after is not None
    assert before.confidence == pytest.approx(0.85) and after.confidence == pytest.approx(0.95)
    assert after.evidence["tensor_active"] == pytest.approx(0.004, abs=0.001)
    assert "tensor-pipe counter confirms" in after.summary


def test_no_mixed_precision_from_the_counter_alone_and_contradicted_by_it() -> None:
    unknown = dict(param_dtype=None, tf32=None, autocast_dtype=None)
    assert finding(profile("cuda", util=95.0, **unknown), "no_mixed_precision") is None
    f = finding(counters(profile("cuda", util=95.0, **unknown), sm=0.8, tensor=0.003), "no_mixed_precision")
    assert f is not None and "tensor pipes are idle while the SMs work" in f.summary
    assert f.evidence["tensor_active"] == pytest.approx(0.003, abs=0.001)
    bf16 = counters(profile("cuda", util=95.0), sm=0.8, tensor=0.003)  # bf16 said by the run: left alone
    assert finding(bf16, "no_mixed_precision") is None
    busy = finding(
        counters(profile("cuda", util=95.0, param_dtype="fp32", tf32=False), sm=0.8, tensor=0.45),
        "no_mixed_precision",
    )
    assert busy is not None and busy.confidence == pytest.approx(0.4) and "some matrix math" in busy.summary


# -- memory-bound: unfused_kernels, low_mfu_unexplained ------------------------------------------------------
def test_memory_bound_names_unfused_kernels_offline_with_low_confidence() -> None:
    p = counters(profile("cuda", util=95.0), sm=0.8, occ=0.5, tensor=0.05, dram=0.7)
    f = finding(p, "unfused_kernels")
    assert f is not None and f.confidence == pytest.approx(0.45) and f.est_speedup is None
    assert f.evidence["memory_bound"] is True and f.evidence["dram_active"] == pytest.approx(0.7)
    assert [u.remedy for u in f.fix.uses] == [RemedyId.LIGER_KERNELS, RemedyId.COMPILE_MODEL]
    not_bound = counters(profile("cuda", util=95.0), sm=0.8, occ=0.5, tensor=0.4, dram=0.7)
    assert finding(not_bound, "unfused_kernels") is None


def test_memory_bound_raises_a_seen_unfused_finding() -> None:
    kernels = KernelFacts(optimizer="AdamW", optimizer_fused=False, optimizer_foreach=False)
    kernels.liger_installed, kernels.liger_applied = False, False
    seen = finding(profile("cuda", steps(), util=95.0, kernels=kernels), "unfused_kernels")
    p = counters(profile("cuda", steps(), util=95.0, kernels=kernels), sm=0.8, occ=0.5, tensor=0.05, dram=0.7)
    agreed = finding(p, "unfused_kernels")
    assert seen is not None and agreed is not None
    assert agreed.confidence == pytest.approx(seen.confidence + 0.15)
    assert agreed.est_speedup == pytest.approx(seen.est_speedup)
    assert "memory-bound" in agreed.summary


def test_low_mfu_more_sure_when_memory_bound() -> None:
    slow = profile("cuda", steps(wall=1.5), util=96.0)
    plain = finding(slow, "low_mfu_unexplained")
    bound = finding(counters(profile("cuda", steps(wall=1.5), util=96.0), sm=0.85, occ=0.5, tensor=0.05, dram=0.75),
                    "low_mfu_unexplained")  # fmt: skip
    assert plain is not None and bound is not None
    assert plain.confidence == pytest.approx(0.5) and bound.confidence == pytest.approx(0.65)
    assert bound.evidence["memory_bound"] is True and "memory-bound" in bound.summary


# -- from a file to a finding ---------------------------------------------------------------------------------
def test_dmon_file_to_small_batch(tmp_path: Path) -> None:
    rows = "".join(f"GPU 0     0.985  0.31{i % 10}  0.110  0.21{i % 10}  0.240  512.0\n" for i in range(30))
    path = tmp_path / "dmon.txt"
    path.write_text(
        "#Entity   GRACT  SMACT  SMOCC  TENSO  DRAMA  POWER\nID                                  W\n" + rows
    )
    p = load_run(Inputs(paths=[path], gpu="h100"))
    f = finding(p, "small_batch")
    assert f is not None and f.evidence["activity_source"] == "dcgmi dmon"
    assert f.evidence["sm_active"] == pytest.approx(0.3145, abs=0.001)
    assert f.evidence["sm_occupancy"] == pytest.approx(0.11)
