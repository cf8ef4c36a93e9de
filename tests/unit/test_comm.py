"""plan/comm: the communication volumes per optimizer step, checked against hand-computed figures, and the
plan's communication block (JSON keys, the options each sharding strategy has)."""

from __future__ import annotations

import pytest

from pitstop.hardware import lookup_gpu
from pitstop.interconnect import LINKS
from pitstop.plan.build import PlanRequest, build_plan
from pitstop.plan.comm import comm_per_step, intra_link, strategy_of
from pitstop.plan.planner import PlanError

P8B = 8_030_261_248  # llama-3.1-8b's parameters (the preset, exact)
BF16 = 2.0 * P8B  # bytes of its bf16 weights, and of its bf16 gradients


def test_ddp_all_reduce_of_an_8b_model_on_8_gpus_over_nvlink4() -> None:
    cp = comm_per_step("no_shard", BF16, BF16, 8, 1, LINKS["nvlink4"], LINKS["ib_ndr"])
    # 2·7/8 × 16.06 GB = 28.106 GB through each GPU's link, at 80% of 450 GB/s = 360 GB/s
    assert [c.op for c in cp.collectives] == ["all_reduce"]
    assert cp.bus_bytes == pytest.approx(2 * 7 / 8 * BF16)
    assert cp.bus_bytes / 1e9 == pytest.approx(28.106, abs=1e-3)
    assert cp.seconds == pytest.approx(0.07807, abs=1e-5)


def test_ddp_across_two_nodes_over_100_gbe_runs_at_the_network() -> None:
    cp = comm_per_step("no_shard", BF16, BF16, 16, 2, LINKS["nvlink4"], LINKS["eth100"])
    # 2·15/16 × 16.06 GB = 30.113 GB at 80% of 12.5 GB/s = 10 GB/s: 3.01 s per step
    assert cp.bus_bytes / 1e9 == pytest.approx(30.113, abs=1e-3)
    assert cp.seconds == pytest.approx(3.0113, abs=1e-4)
    assert cp.collectives[0].link.key == "eth100"


def test_zero3_moves_three_times_the_parameters() -> None:
    cp = comm_per_step("full_shard", BF16, BF16, 8, 1, LINKS["nvlink4"], None)
    assert [c.op for c in cp.collectives] == ["all_gather", "all_gather", "reduce_scatter"]
    assert cp.bus_bytes == pytest.approx(3 * 7 / 8 * BF16)  # 42.16 GB
    ddp = comm_per_step("no_shard", BF16, BF16, 8, 1, LINKS["nvlink4"], None)
    assert cp.bus_bytes / ddp.bus_bytes == pytest.approx(1.5)


def test_hybrid_shard_keeps_the_gathers_in_the_node() -> None:
    cp = comm_per_step("hybrid_shard", BF16, BF16, 16, 2, LINKS["nvlink4"], LINKS["eth100"])
    inside = [c for c in cp.collectives if c.link.key == "nvlink4"]
    across = [c for c in cp.collectives if c.link.key == "eth100"]
    assert len(inside) == 3 and all(c.ranks == 8 for c in inside)
    # the node's gradient shard (16.06 GB / 8) all-reduced over 2 nodes: 2·1/2 × 2.008 GB at 10 GB/s
    assert len(across) == 1 and across[0].op == "all_reduce" and across[0].ranks == 2
    assert across[0].seconds == pytest.approx(BF16 / 8 / 10e9)
    assert cp.seconds == pytest.approx(3 * 7 / 8 * BF16 / 360e9 + BF16 / 8 / 10e9)
    full = comm_per_step("full_shard", BF16, BF16, 16, 2, LINKS["nvlink4"], LINKS["eth100"])
    assert full.seconds > 10 * cp.seconds


def test_hpz_moves_the_backward_gather_into_the_node() -> None:
    cp = comm_per_step("zero3_hpz", BF16, BF16, 16, 2, LINKS["nvlink4"], LINKS["ib_ndr"])
    links = [(c.what, c.link.key, c.ranks) for c in cp.collectives]
    assert ("parameter all-gather, backward (in the node)", "nvlink4", 8) in links
    assert sum(1 for _, key, _ in links if key == "ib_ndr") == 2


def test_accumulation_repeats_gathers_but_ddp_reduces_once() -> None:
    ddp = comm_per_step("no_shard", BF16, BF16, 8, 1, LINKS["nvlink4"], None, accumulation=4)
    fsdp = comm_per_step("full_shard", BF16, BF16, 8, 1, LINKS["nvlink4"], None, accumulation=4)
    one = comm_per_step("full_shard", BF16, BF16, 8, 1, LINKS["nvlink4"], None)
    assert ddp.collectives[0].per_step == 1
    assert fsdp.bus_bytes == pytest.approx(4 * one.bus_bytes)


def test_one_gpu_communicates_nothing_and_lora_reduces_only_adapters() -> None:
    assert comm_per_step("no_shard", BF16, BF16, 1, 1, LINKS["nvlink4"], None).collectives == ()
    lora = build_plan(PlanRequest("llama-3.1-8b", gpus=8, method="lora"))
    assert lora.comm is not None
    trainable = lora.params.trainable
    (reduce,) = lora.comm["collectives"]
    assert reduce["gb_on_the_bus"] == pytest.approx(2 * 7 / 8 * 4 * trainable / 1e9, abs=1e-3)


def test_strategy_names_and_links() -> None:
    assert strategy_of(0) == "no_shard" and strategy_of(2) == "zero2" and strategy_of(3) == "full_shard"
    assert strategy_of(3, hpz=8) == "zero3_hpz" and strategy_of(3, "hybrid_shard") == "hybrid_shard"
    for key, link in (
        ("H100-SXM", "nvlink4"),
        ("H100-PCIe", "pcie5"),
        ("A100-80GB", "nvlink3"),
        ("L4", "pcie4"),
    ):
        spec = lookup_gpu(key)
        assert spec is not None and intra_link(spec).key == link


def test_plan_json_carries_communication_beside_compute() -> None:
    plan = build_plan(PlanRequest("llama-3.1-8b", gpus=16, nodes=2, zero=3, network="eth100"))
    doc = plan.to_dict()
    comm = doc["communication"]
    assert doc["setup"]["nodes"] == 2 and doc["setup"]["zero"] == 3  # existing keys keep their meaning
    assert comm["strategy"] == "full_shard" and comm["gpus_per_node"] == 8
    assert comm["gb_on_the_bus_per_step"] == pytest.approx(3 * 15 / 16 * BF16 / 1e9, abs=1e-3)
    assert comm["comm_s_per_step"] == pytest.approx(3 * 15 / 16 * BF16 / 10e9, abs=1e-3)
    assert comm["compute_s_per_step"] > 0 and comm["backward_s_per_step"] < comm["compute_s_per_step"]
    options = {o["strategy"]: o for o in comm["options"]}
    assert options["zero2"]["fits"] and not options["no_shard"]["fits"]
    assert options["hybrid_shard"]["comm_s"] < options["full_shard"]["comm_s"]
    assert options["full_shard"]["memory_gib"] < options["hybrid_shard"]["memory_gib"]
    assert "communication" not in build_plan(PlanRequest("llama-3.2-1b")).to_dict()


def test_fsdp_sharding_maps_onto_zero_memory_and_bad_layouts_are_one_line_errors() -> None:
    fsdp = build_plan(PlanRequest("llama-3.1-8b", gpus=8, sharding="full_shard"))
    zero3 = build_plan(PlanRequest("llama-3.1-8b", gpus=8, zero=3))
    assert fsdp.setup.zero == 3
    # FSDP's sharded fp32 parameter is the master copy (bf16 only when gathered): 2 bytes per parameter over the
    # shards fewer than ZeRO-3's bf16 shard beside its fp32 one
    shard_bf16 = 2 * fsdp.params.total / 8
    assert zero3.mem.weights - fsdp.mem.weights == pytest.approx(shard_bf16, rel=0.02)
    hybrid = build_plan(PlanRequest("llama-3.1-8b", gpus=16, nodes=2, sharding="HYBRID_SHARD"))
    assert hybrid.mem.weights == pytest.approx(fsdp.mem.weights)  # sharded over one node's 8 GPUs
    for bad in (
        dict(gpus=12, nodes=5),
        dict(gpus=8, sharding="sideways"),
        dict(gpus=8, sharding="full_shard", zero=2),
        dict(gpus=8, zero=2, hpz=8),
        dict(gpus=8, network="carrier-pigeon"),
    ):
        with pytest.raises(PlanError):
            build_plan(PlanRequest("llama-3.1-8b", **bad))  # type: ignore[arg-type]
