"""DeepSpeed config reading, packing plans, and the RunProfile's JSON round trip."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tests.factories import profile

from pitstop.core.profile import RunProfile
from pitstop.data import plan_packing
from pitstop.diagnose import diagnose
from pitstop.ds_config import offload_from_deepspeed


@pytest.mark.parametrize(
    ("name", "stage", "offload"),
    [
        ("axolotl__deepspeed_configs__zero2.json", 2, {"optimizer": "cpu"}),
        ("axolotl__deepspeed_configs__zero3_bf16.json", 3, {}),
        ("axolotl__deepspeed_configs__zero3_bf16_cpuoffload_params.json", 3, {"param": "cpu"}),
        (
            "axolotl__deepspeed_configs__zero3_bf16_cpuoffload_all.json",
            3,
            {"param": "cpu", "optimizer": "cpu"},
        ),
    ],
)
def test_real_deepspeed_configs(shared_data: Path, name: str, stage: int, offload: dict[str, str]) -> None:
    assert offload_from_deepspeed(shared_data / "configs" / "deepspeed" / name) == (stage, offload)


def test_legacy_and_auto_keys() -> None:
    assert offload_from_deepspeed({"zero_optimization": {"stage": 2, "cpu_offload": True}}) == (
        2,
        {"optimizer": "cpu"},
    )
    assert offload_from_deepspeed(
        {"zero_optimization": {"stage": "auto", "offload_param": {"device": "nvme"}}}
    ) == (None, {"param": "nvme"})
    assert offload_from_deepspeed({"zero_optimization": {"offload_optimizer": {"device": "none"}}}) == (
        None,
        {},
    )
    assert offload_from_deepspeed({}) == (None, {})
    with pytest.raises(ValueError):
        offload_from_deepspeed(42)


def test_packing_plan_is_valid_and_tight() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(1, 300) for _ in range(5000)] + [600]
    plan = plan_packing(lengths, 512, overflow="drop")
    placed = [i for b in plan.bins for i in b]
    assert sorted(placed + plan.too_long) == list(range(len(lengths)))
    assert plan.too_long == [5000] and plan.dropped_tokens == 600
    assert all(sum(lengths[i] for i in b) <= 512 for b in plan.bins)
    assert len(plan.bins) <= plan.lower_bound * 1.02  # best-fit decreasing is within 2% of the bound here
    assert 0.97 < plan.efficiency <= 1.0
    with pytest.raises(ValueError):
        plan_packing([1], 0)


def test_profile_json_round_trip(tmp_path: Path) -> None:
    p = profile("cuda", util=80.0, ranks=2)
    path = tmp_path / "p.json"
    p.save(path)
    again = RunProfile.load(path)
    assert again == p
    assert diagnose(again).to_dict()["metrics"] == diagnose(p).to_dict()["metrics"]
    doc = json.loads(path.read_text())
    doc["ranks"][0]["a_field_from_the_future"] = 1  # newer writers may add fields
    assert RunProfile.from_dict(doc).ranks[0].rank == 0
