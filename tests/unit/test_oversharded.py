"""oversharded: one rule and one remedy. ZeRO-3 / FULL_SHARD where ZeRO-2 / SHARD_GRAD_OP fits, or across
nodes without a hybrid; the extra traffic is plan/comm's; the fix says how per framework."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from tests.factories import profile, steps

from pitstop.core.findings import Finding
from pitstop.core.profile import ModelInfo, RunProfile
from pitstop.core.vocabulary import CauseId, Framework, Sharding
from pitstop.diagnose import diagnose
from pitstop.diagnose.causes import CAUSES
from pitstop.ingest.configs import read_config
from pitstop.interconnect import LINKS
from pitstop.plan.comm import comm_per_step
from pitstop.remedies import RemedyId, advise, remedy, use

BIG = ModelInfo(params_total=13_000_000_000, params_trainable=13_000_000_000)  # no shape: model states only


def _run(gpus: int, **env: object) -> RunProfile:
    return profile("cuda", steps(wall=0.5), util=95.0, world_size=gpus, **env)


def _oversharded(run: RunProfile) -> Finding | None:
    return next((f for f in diagnose(run).findings if f.cause == "oversharded"), None)


def test_zero3_where_zero2_fits_is_oversharded() -> None:
    finding = _oversharded(_run(8, zero_stage=3, framework="deepspeed"))
    assert finding is not None
    ev = finding.evidence
    assert ev["reason"] == "lighter_fits" and ev["strategy"] == "full_shard" and ev["suggested"] == "zero2"
    assert ev["world_size"] == 8 and ev["nodes"] == 1 and ev["links"] == ["nvlink4"]
    gib = ev["plan_gib_per_gpu"]
    assert isinstance(gib, dict) and gib["full_shard"] < gib["zero2"] < 0.9 * 80
    # the one extra all-gather of 1.24B bf16 weights over 8 GPUs: 7/8 × 2.47 GB, at 360 GB/s
    weights = 2.0 * 1_235_814_400
    on_bus = ev["gb_on_the_bus_per_step_est"]
    assert isinstance(on_bus, dict)
    assert on_bus["full_shard"] - on_bus["zero2"] == pytest.approx(7 / 8 * weights / 1e9, abs=1e-3)
    assert ev["extra_comm_s_per_step_est"] == pytest.approx(7 / 8 * weights / 360e9, abs=1e-4)
    assert finding.est_speedup is not None and "estimate" in finding.speedup_basis
    assert finding.fix.uses[0].remedy is RemedyId.LIGHTER_SHARDING
    assert '"stage": 2' in finding.fix.snippets["deepspeed"]


def test_zero2_ddp_and_one_gpu_are_not_oversharded() -> None:
    assert _oversharded(_run(8, zero_stage=2)) is None
    assert _oversharded(_run(8, zero_stage=0)) is None
    assert _oversharded(_run(1, zero_stage=3)) is None
    assert _oversharded(profile("cpu", world_size=8, zero_stage=3)) is None


def test_full_shard_that_needs_sharding_on_one_node_is_not_oversharded() -> None:
    # 13B on 8 GPUs: SHARD_GRAD_OP keeps 4 bytes of weights and gradients per parameter, 52 GB + the shards
    run = _run(8, fsdp_sharding="full_shard", model=dataclasses.replace(BIG))
    assert _oversharded(run) is None


def test_full_shard_across_nodes_without_hybrid_is_oversharded() -> None:
    run = _run(
        16, fsdp_sharding="full_shard", nodes=2, model=dataclasses.replace(BIG), framework="accelerate"
    )
    finding = _oversharded(run)
    assert finding is not None
    ev = finding.evidence
    assert ev["reason"] == "spans_nodes" and ev["suggested"] == "hybrid_shard" and ev["nodes"] == 2
    now = comm_per_step("full_shard", 26e9, 26e9, 16, 2, LINKS["nvlink4"], LINKS["ib_ndr"])
    hybrid = comm_per_step("hybrid_shard", 26e9, 26e9, 16, 2, LINKS["nvlink4"], LINKS["ib_ndr"])
    assert ev["extra_comm_s_per_step_est"] == pytest.approx(now.seconds - hybrid.seconds, abs=1e-3)
    # every byte of FULL_SHARD crosses the network; HYBRID_SHARD sends only the node's gradient shard
    assert ev["network_gb_per_step_est"] == {
        "full_shard": pytest.approx(3 * 15 / 16 * 26),
        "hybrid_shard": pytest.approx(26 / 8 / 2 * 2, abs=1e-3),
    }
    assert finding.est_speedup == pytest.approx(2.0)  # untimed exposure: at most half the 0.5 s step
    assert "fsdp_sharding_strategy: HYBRID_SHARD" in finding.fix.snippets["accelerate"]
    # already hybrid and needing it: nothing to say
    assert (
        _oversharded(_run(16, fsdp_sharding="hybrid_shard", nodes=2, model=dataclasses.replace(BIG))) is None
    )


def test_deepspeed_across_nodes_is_told_about_hpz() -> None:
    run = _run(16, zero_stage=3, nodes=2, model=dataclasses.replace(BIG), framework="deepspeed")
    finding = _oversharded(run)
    assert finding is not None and finding.evidence["suggested"] == "zero3_hpz"
    assert '"zero_hpz_partition_size": 8' in finding.fix.snippets["deepspeed"]
    assert _oversharded(_run(16, zero_stage=3, zero_hpz=8, nodes=2, model=dataclasses.replace(BIG))) is None


def test_the_remedys_advice_per_framework() -> None:
    r = remedy(RemedyId.LIGHTER_SHARDING)
    assert r.preserves_computation and not r.tunable and CAUSES[CauseId.OVERSHARDED].remedies == (r.id,)
    sgo = {"current": "full_shard", "target": "shard_grad_op", "deepspeed": False, "saved_s": 0.04}
    assert (
        r.advice(Framework.HF_TRAINER, sgo).snippet
        == 'args = TrainingArguments(..., fsdp="shard_grad_op auto_wrap")'
    )
    assert 'SFTConfig(..., fsdp="shard_grad_op' in r.advice(Framework.TRL, sgo).snippet
    pt = r.advice(Framework.PYTORCH, sgo).snippet
    assert "ShardingStrategy.SHARD_GRAD_OP" in pt and "reshard_after_forward=False" in pt
    acc = r.advice(Framework.ACCELERATE, sgo).snippet
    assert "fsdp_sharding_strategy: SHARD_GRAD_OP" in acc and "fsdp_reshard_after_forward: false" in acc
    assert 'FSDPStrategy(sharding_strategy="SHARD_GRAD_OP")' in r.advice(Framework.LIGHTNING, sgo).snippet
    hybrid = {"target": "hybrid_shard", "gpus_per_node": 4}
    assert "HYBRID_SHARD" in r.advice(Framework.PYTORCH, hybrid).snippet
    assert "(world_size // 4, 4)" in r.advice(Framework.PYTORCH, hybrid).snippet
    assert 'fsdp="hybrid_shard auto_wrap"' in r.advice(Framework.HF_TRAINER, hybrid).snippet
    z2 = {"current": "full_shard", "target": "zero2", "deepspeed": True}
    assert '"stage": 2' in r.advice(Framework.DEEPSPEED, z2).snippet
    assert "deepspeed=..." in r.advice(Framework.HF_TRAINER, z2).snippet
    assert "zero_stage: 2" in r.advice(Framework.ACCELERATE, z2).snippet
    assert "deepspeed_stage_2" in r.advice(Framework.LIGHTNING, z2).snippet
    fix = advise("hf_trainer", use(RemedyId.LIGHTER_SHARDING, **z2))
    assert "zero2" in fix.text and "cannot" not in fix.text


def test_sharding_is_read_from_configs() -> None:
    hf = read_config({"fsdp": "full_shard auto_wrap"}, "hf_args", Path("args.json")).env
    assert hf.fsdp_sharding == "full_shard"
    acc = read_config(
        {"num_processes": 16, "fsdp_config": {"fsdp_sharding_strategy": "HYBRID_SHARD"}},
        "accelerate",
        Path("acc.yaml"),
    ).env
    assert acc.fsdp_sharding == "hybrid_shard"
    fsdp2 = read_config(
        {"fsdp_config": {"fsdp_version": 2, "fsdp_reshard_after_forward": False}},
        "accelerate",
        Path("acc.yaml"),
    ).env
    assert fsdp2.fsdp_sharding == "shard_grad_op"
    ds = read_config(
        {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}},
        "deepspeed",
        Path("ds.json"),
    ).env
    assert ds.zero_stage == 3 and ds.zero_hpz == 8
    assert Sharding.parse(2) is Sharding.SHARD_GRAD_OP and Sharding.parse("ShardingStrategy.FULL_SHARD")
    assert Sharding.parse(True) is None and Sharding.parse("auto_wrap") is None
    assert Sharding.parse("²") is None  # a digit int() refuses is no strategy, not an error
    odd = read_config(
        {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": "²"}}, "deepspeed", Path("ds.json")
    )
    assert odd.env.zero_stage == 3 and odd.env.zero_hpz is None
