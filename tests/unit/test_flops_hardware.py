"""The FLOPs model, MFU, expected throughput and the hardware table."""

from __future__ import annotations

import dataclasses

import pytest
from tests.factories import LLAMA_1B

from pitstop.core.profile import ModelInfo
from pitstop.hardware import GPUS, compute_dtype, lookup_gpu
from pitstop.plan.flops import expected_tokens_per_s, flops_per_token, matmul_params, mfu


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA GeForce RTX 3090", "RTX-3090"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("Tesla V100-SXM2-32GB", "V100-32GB"),
        ("Tesla V100-SXM2-16GB", "V100-16GB"),
        ("NVIDIA GH200 480GB", "GH200-96GB"),
        ("NVIDIA GH200 144G HBM3e", "GH200-144GB"),
        ("Tesla T4", "T4"),
        ("AMD Instinct MI250X/MI250", "MI250X"),
        ("AMD Instinct MI300X", "MI300X"),
        ("h100-sxm", "H100-SXM"),
        ("NVIDIA H100 NVL", "H100-NVL"),
    ],
)
def test_device_names_map_to_table_rows(name: str, key: str) -> None:
    spec = lookup_gpu(name)
    assert spec is not None and spec.key == key


@pytest.mark.parametrize("name", ["NVIDIA A10", "NVIDIA L40", "Intel Gaudi2", "", None])
def test_unknown_hardware_is_unknown(name: str | None) -> None:
    assert lookup_gpu(name) is None


def test_every_row_has_a_source_and_sane_peaks() -> None:
    for spec in GPUS:
        assert spec.source
        fp32 = spec.peak_flops("fp32")
        assert fp32 is not None and fp32 > 1e12
        for dtype in ("bf16", "fp16", "tf32"):
            peak = spec.peak_flops(dtype)
            assert peak is None or peak >= fp32


def test_compute_dtype() -> None:
    assert compute_dtype("fp32", "bf16", False) == "bf16"
    assert compute_dtype("bf16", None, None) == "bf16"
    assert compute_dtype("fp32", None, True) == "tf32"
    assert compute_dtype("fp32", None, False) == "fp32"
    assert compute_dtype(None, None, None) is None


def _llama_1b() -> ModelInfo:
    return dataclasses.replace(LLAMA_1B)  # Llama 3.2 1B: 16 layers, d=2048, 32 heads x 64, vocab 128256, tied


def test_flops_per_token_formula() -> None:
    model = _llama_1b()
    fpt = flops_per_token(model, context_len=2048)
    assert fpt is not None
    # tied: the embedding table is used once per token as the output projection
    assert matmul_params(model) == 1_235_814_400
    assert fpt.dense == pytest.approx(6 * 1_235_814_400)
    assert fpt.attention == pytest.approx(12 * 16 * 2048 * 2048)


def test_lora_counts_frozen_weights_at_four_flops() -> None:
    model = _llama_1b()
    model.params_trainable = 10_000_000
    fpt = flops_per_token(model, None)
    assert fpt is not None
    assert fpt.dense == pytest.approx(6 * 10_000_000 + 4 * (1_235_814_400 - 10_000_000))
    assert "frozen" in fpt.basis


def test_mfu_and_expected_are_consistent() -> None:
    gpu = lookup_gpu("H100-SXM")
    assert gpu is not None
    fpt = flops_per_token(_llama_1b(), 2048)
    assert fpt is not None
    low, high = expected_tokens_per_s(fpt, gpu, "bf16", n_gpus=1, mfu_range=(0.40, 0.50)) or (0, 0)
    assert mfu(low, fpt, gpu, "bf16", 1) == pytest.approx(0.40)
    assert mfu(high, fpt, gpu, "bf16", 1) == pytest.approx(0.50)
    assert mfu(low, fpt, gpu, "bf16", 2) == pytest.approx(0.20)
    assert mfu(1000, fpt, lookup_gpu("T4"), "bf16", 1) is None  # T4 has no bf16 path


def test_flops_unknown_without_parameter_count() -> None:
    assert flops_per_token(ModelInfo(), 1024) is None


@pytest.mark.parametrize(
    ("name", "gib"),
    [
        ("NVIDIA L4", 22.49),  # "24 GB" on the datasheet
        ("NVIDIA A10G", 22.49),
        ("NVIDIA L40S", 44.99),
        ("Tesla T4", 15.0),
        ("Tesla V100-SXM2-16GB", 15.78),  # not planned as the 32 GB card
        ("NVIDIA GH200 480GB", 95.58),  # the 96 GB HBM3 superchip, not the H200's 141 GB
        ("NVIDIA H200", 140.4),
    ],
)
def test_capacities_are_what_the_driver_reports_in_mib(name: str, gib: float) -> None:
    spec = lookup_gpu(name)
    assert spec is not None and spec.memory_gib == pytest.approx(gib, abs=0.01)
    assert spec.memory_bytes == spec.memory_mib * 2**20
