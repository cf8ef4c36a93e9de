"""Who waits for whom, from recorded collectives: clock alignment, arrival skew, bandwidth, the rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from pitstop.clock_reasons import SW_POWER_CAP
from pitstop.core.profile import (
    CollectiveRecord,
    CpuThreads,
    Environment,
    GpuSample,
    RankProfile,
    RunProfile,
    StepRecord,
)
from pitstop.diagnose import diagnose
from pitstop.diagnose.ranks import analyse, bus_factor, clock_offsets
from pitstop.interconnect import transport

STEP = 0.100
MB100 = 100_000_000


def _profile(late_rank: int | None, late_s: float, transfer_s: float, clock: str = "device") -> RunProfile:
    """Three ranks, 10 steps, one async gradient all-reduce per step (DDP's shape). Each rank's clock has
    its own origin; ``late_rank`` finishes its backward ``late_s`` after the others each step (``late_rank`` <
    0: a different rank each step)."""
    offsets = {0: 0.0, 1: 5.0, 2: -3.0}
    ranks = []
    for rank, off in offsets.items():
        steps, colls = [], []
        for i in range(10):
            t0 = i * (STEP + late_s)  # the job's common clock: every step ends when the all-reduce ends
            slow = rank == (i % 3 if late_rank is not None and late_rank < 0 else late_rank)
            compute = STEP - transfer_s
            arrive = t0 + compute + (late_s if slow else 0.0)
            last = t0 + compute + late_s
            done = last + transfer_s
            mine = compute + (late_s if slow else 0.0)
            steps.append(
                StepRecord(
                    index=i + 1,
                    wall_s=STEP + late_s,
                    forward_s=mine * 0.4,
                    backward_s=mine * 0.6 + (done - arrive),
                    optimizer_s=0.0,
                    tokens=1000,
                    real_tokens=1000,
                    end_t=done + off,
                )
            )
            colls.append(
                CollectiveRecord(
                    step=i + 1,
                    op="all_reduce",
                    group="0,1,2",
                    seq=i,
                    bytes=MB100,
                    size=3,
                    issued_t=arrive + off,
                    done_t=done + off,
                    source="ddp",
                    clock=clock,
                )
            )
        env = Environment(device="cuda", gpu_name="NVIDIA H100 80GB HBM3", world_size=3, dist_backend="nccl")
        ranks.append(RankProfile(rank=rank, steps=steps, collectives=colls, environment=env))
    return RunProfile(source="doctor", ranks=ranks)


def test_clocks_are_aligned_on_collective_ends() -> None:
    offsets = clock_offsets(_profile(2, 0.03, 0.01).ranks)
    assert offsets[0] == 0.0
    assert offsets[1] == pytest.approx(5.0) and offsets[2] == pytest.approx(-3.0)


def test_the_late_rank_is_named_by_arrival_and_the_others_wait_for_it() -> None:
    a = analyse(_profile(2, 0.03, 0.01))
    assert a is not None and a.clock == "device"
    assert a.straggler == 2 and a.persistent and a.straggler_last_frac == 1.0
    assert a.skew_s == pytest.approx(0.03)
    rows = {r.rank: r for r in a.ranks}
    assert rows[0].wait_s == pytest.approx(0.03) and rows[1].wait_s == pytest.approx(0.03)
    assert rows[2].wait_s == pytest.approx(0.0)
    assert all(r.comm_s == pytest.approx(0.01) for r in a.ranks)
    assert rows[2].compute_s == pytest.approx(rows[0].compute_s + 0.03)  # type: ignore[operator]
    (bw,) = a.bandwidth
    assert bw.algbw_gbps == pytest.approx(10.0)  # 100 MB in 10 ms
    assert bw.busbw_gbps == pytest.approx(10.0 * 4 / 3)  # × 2(n−1)/n


def test_straggler_finding_names_rank_and_reason_compute() -> None:
    d = diagnose(_profile(2, 0.03, 0.01))
    f = next(f for f in d.findings if f.cause == "straggler")
    assert f.evidence["slow_rank"] == 2 and f.evidence["reason"] == "compute" and f.evidence["persistent"]
    assert f.evidence["others_wait_frac_of_step"] == pytest.approx(0.03 / 0.13, abs=1e-3)
    assert "Rank 2 arrives last" in f.summary and "Ranks 0, 1 spend" in f.summary
    assert d.scaling is not None and d.metrics.scaling_efficiency == d.scaling.efficiency
    # derived reference: a rank's step without waiting and communication; the loss is split into its parts
    waiting = (0.03 + 0.03 + 0.0) / 3 / 0.13
    assert d.scaling.efficiency == pytest.approx(1 - waiting - 0.01 / 0.13, abs=1e-3)
    assert d.scaling.lost["waiting"] == pytest.approx(waiting, abs=1e-3)


def test_the_straggler_reason_names_a_power_capped_gpu() -> None:
    p = _profile(2, 0.03, 0.01)
    for r in p.ranks:
        slow = r.rank == 2
        r.gpu_samples = [
            GpuSample(
                t=i,
                util=95.0,
                sm_clock=1110.0 if slow else 1980.0,
                app_clock=1980.0,
                clock_reasons=SW_POWER_CAP if slow else 0,
            )
            for i in range(20)
        ]
    f = next(f for f in diagnose(p).findings if f.cause == "straggler")
    assert f.evidence["slow_rank"] == 2
    assert "1,110 MHz vs 1,980 MHz on the others (SW power cap)" in str(f.evidence["reason_detail"])


def test_the_straggler_reason_names_a_cpu_shared_with_other_work() -> None:
    p = _profile(2, 0.03, 0.01)
    for r in p.ranks:
        queue = 24.0 if r.rank == 2 else 7.0  # runnable threads on 8 allowed cores
        r.environment.cpu = CpuThreads(cores_allowed=8, torch_threads=4, machine_run_queue=queue)
    f = next(f for f in diagnose(p).findings if f.cause == "straggler")
    assert "its CPU is oversubscribed: 3.0 runnable threads per core vs 0.9" in str(
        f.evidence["reason_detail"]
    )
    for r in p.ranks:  # the same load everywhere explains no rank
        r.environment.cpu = CpuThreads(cores_allowed=8, torch_threads=4, machine_run_queue=24.0)
    f = next(f for f in diagnose(p).findings if f.cause == "straggler")
    assert "CPU" not in str(f.evidence["reason_detail"])


def test_a_last_rank_that_changes_every_step_is_noise() -> None:
    a = analyse(_profile(-1, 0.03, 0.01))
    assert a is not None and not a.persistent
    f = next(f for f in diagnose(_profile(-1, 0.03, 0.01)).findings if f.cause == "straggler")
    assert f.severity != "high" and "changes from step to step" in f.summary


def test_communication_bound_live_with_bandwidth_against_the_link() -> None:
    d = diagnose(_profile(None, 0.0, 0.04))
    f = next(f for f in d.findings if f.cause == "communication_bound")
    assert f.evidence["exposed_frac_of_step"] == pytest.approx(0.4, abs=1e-3)
    assert f.evidence["bandwidth"]["all_reduce"]["busbw_gbps"] == pytest.approx(3.333, abs=1e-3)
    assert f.evidence["link"] == "nvlink4" and "transport" in f.evidence["likely_causes"]  # 3 GB/s on NVLink
    assert f.severity == "high"
    assert not any(x.cause == "straggler" for x in d.findings)


def test_communication_bound_carries_the_plans_prediction_when_the_model_is_known() -> None:
    from pitstop.core.profile import ModelInfo
    from pitstop.plan.build import PlanRequest, build_plan

    assert (
        "planned_comm_s_per_step"
        not in next(
            f for f in diagnose(_profile(None, 0.0, 0.04)).findings if f.cause == "communication_bound"
        ).evidence
    )  # no model size: nothing to predict
    run = _profile(None, 0.0, 0.04)
    for r in run.ranks:
        r.environment.model = ModelInfo(params_total=1_235_814_400, params_trainable=1_235_814_400)
    f = next(f for f in diagnose(run).findings if f.cause == "communication_bound")
    # DDP over 3 H100s on NVLink4: 2·2/3 × 2.47 GB of bf16 gradients at 360 GB/s
    assert f.evidence["planned_strategy"] == "no_shard"
    assert f.evidence["planned_comm_s_per_step"] == pytest.approx(4 / 3 * 2 * 1_235_814_400 / 360e9, abs=1e-4)
    plan = build_plan(PlanRequest("llama-3.2-1b", gpus=3))  # the same model size: the plan agrees
    assert plan.comm is not None and plan.params.total == 1_235_814_400
    assert plan.comm["comm_s_per_step"] == f.evidence["planned_comm_s_per_step"]
    assert f.evidence["exposed_frac_of_step"] == pytest.approx(0.4, abs=1e-3)  # existing keys stay


def test_bus_bandwidth_factors() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert bus_factor("reduce_scatter", 2) == pytest.approx(0.5)
    assert bus_factor("broadcast", 8) == 1.0
    assert bus_factor("all_reduce", 1) == 0.0


def test_transport_reads_the_settings_that_force_a_choice() -> None:
    sockets = transport("nccl", "cuda", "NVIDIA H100", 4, {"NCCL_IB_DISABLE": "1"})
    assert "sockets" in sockets.name and sockets.warnings
    assert transport("nccl", "cuda", "NVIDIA H100 80GB HBM3", 1, {}).link.key == "nvlink4"  # type: ignore[union-attr]
    assert transport("nccl", "cuda", "NVIDIA A100-PCIE-40GB", 1, {}).link.key == "pcie4"  # type: ignore[union-attr]
    assert transport("gloo", "cpu", None, 1, None).link is None
    assert transport("gloo", "cuda", "NVIDIA H100", 1, None).warnings  # gloo for CUDA tensors


def test_single_rank_or_no_collectives_gives_no_analysis() -> None:
    p = _profile(2, 0.03, 0.01)
    assert analyse(RunProfile(source="doctor", ranks=p.ranks[:1])) is None
    for r in p.ranks:
        r.collectives = []
    assert analyse(p) is None


def test_reports_show_waiting_and_arrival_per_rank() -> None:
    from rich.console import Console

    from pitstop.report.html import render_html
    from pitstop.report.terminal import render

    d = diagnose(_profile(2, 0.03, 0.01))
    doc = d.to_dict()
    rows = {r["rank"]: r for r in doc["ranks"]}
    assert rows[0]["wait_s"] == pytest.approx(0.03) and rows[2]["arrival_late_s"] > rows[0]["arrival_late_s"]
    assert doc["communication"]["straggler"] == 2 and doc["metrics"]["scaling_efficiency"] is not None
    html = render_html(doc)
    assert 'id="per-rank-split"' in html or "per-rank-split" in html
    assert "per-rank-arrival" in html
    console = Console(record=True, width=140)
    render(d, console)
    text = console.export_text()
    assert "waiting" in text and "all_reduce: 100.0 MB per step" in text and "scaling efficiency" in text


def test_tensorboard_gets_collectives_per_step_and_scaling(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tests.unit.test_tensorboard_export import _read

    from pitstop.report.tensorboard import export_tensorboard

    p = _profile(2, 0.03, 0.01)
    for r in p.ranks:
        for s in r.steps:
            s.collectives, s.collective_bytes = 1, MB100
    export = export_tensorboard(diagnose(p).to_dict(), tmp_path)
    scalars = _read(export.path)
    assert [v for _, v in scalars["pitstop/collective_mb"]] == [pytest.approx(100.0)] * 10
    assert scalars["pitstop/summary/scaling_efficiency"][0][1] < 1.0
    late = _read(export.path / "rank2")  # the straggler's own run: it waits for nobody and arrives 30 ms late
    assert late["pitstop/summary/waiting_ms"][0][1] == pytest.approx(0.0, abs=0.01)
    assert late["pitstop/summary/arrived_last_frac"][0][1] == pytest.approx(1.0)
    assert scalars["pitstop/summary/waiting_ms"][0][1] == pytest.approx(30.0, abs=0.01)  # rank 0 waits for it


def test_communication_remedies_follow_the_evidence() -> None:
    from pitstop.remedies import RemedyId, advise, use

    fix = advise(
        "hf_trainer",
        use(RemedyId.FIX_TRANSPORT, warnings=["NCCL_IB_DISABLE=1 is set"], multi_node=True),
        use(RemedyId.BIGGER_BUCKETS, bucket_mb=200, per_step=120, mb_per_call=0.4),
    )
    assert "NCCL_IB_DISABLE=1" in fix.text and "120 collectives per step" in fix.text
    assert (
        "NCCL_SOCKET_IFNAME" in fix.snippets["pytorch"]
        and "ddp_bucket_cap_mb=200" in fix.snippets["hf_trainer"]
    )
