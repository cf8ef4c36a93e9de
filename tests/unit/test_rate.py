"""The expected MFU per GPU generation and setup (``plan/rate.py``) and the power-limit derate."""

from __future__ import annotations

import pytest

from pitstop.core.profile import ModelInfo
from pitstop.hardware import Generation, PowerLimitError, derated, lookup_gpu
from pitstop.plan.flops import flops_per_token
from pitstop.plan.rate import AC_FULL, expected_mfu

# Llama-3.1-8B's shape (config.json): 32 layers of width 4096, 8.03B parameters, an untied 128,256 vocabulary
LLAMA_8B = ModelInfo(
    params_total=8_030_261_248,
    params_embedding=525_336_576,
    n_layers=32,
    hidden_size=4096,
    n_heads=32,
    head_dim=128,
)


def _gpu(name: str):
    gpu = lookup_gpu(name)
    assert gpu is not None, name
    return gpu


def test_hopper_sits_further_from_its_peak_than_ampere() -> None:
    fpt = flops_per_token(LLAMA_8B, 4096)
    a100 = expected_mfu(_gpu("A100-80GB"), fpt=fpt, model=LLAMA_8B)
    h100 = expected_mfu(_gpu("H100-SXM"), fpt=fpt, model=LLAMA_8B)
    assert 0.45 < a100.low < a100.high < 0.75
    assert 0.30 < h100.low < h100.high < a100.high
    assert "A100" in a100.basis and "Hopper" in h100.basis


def test_checkpointing_lowers_and_compile_raises_the_expected_mfu() -> None:
    gpu, fpt = _gpu("H100-SXM"), flops_per_token(LLAMA_8B, 2048)
    plain = expected_mfu(gpu, fpt=fpt, model=LLAMA_8B)
    full = expected_mfu(gpu, ac="full", fpt=fpt, model=LLAMA_8B)
    compiled = expected_mfu(gpu, compile=True, fpt=fpt, model=LLAMA_8B)
    assert full.low == pytest.approx(plain.low * AC_FULL, rel=1e-3)
    assert "forward recomputed" in full.basis
    assert compiled.high > plain.high and "torch.compile" in compiled.basis


def test_offload_divides_by_its_slowdown_and_unfitted_generations_say_so() -> None:
    gpu, fpt = _gpu("A100-80GB"), flops_per_token(LLAMA_8B, 2048)
    plain = expected_mfu(gpu, fpt=fpt, model=LLAMA_8B)
    slow = expected_mfu(gpu, offload="optimizer", offload_slowdown=2.0, fpt=fpt, model=LLAMA_8B)
    assert slow.high == pytest.approx(plain.high / 2, rel=1e-3)
    mi300 = expected_mfu(_gpu("MI300X"), fpt=fpt, model=LLAMA_8B)
    assert "assumed" in mi300.basis


def test_new_gpus_are_found_by_their_driver_names() -> None:
    for name, key, generation in (
        ("NVIDIA H100 NVL", "H100-NVL", Generation.HOPPER),
        ("NVIDIA H100 PCIe", "H100-PCIe", Generation.HOPPER),
        ("NVIDIA H200 NVL", "H200-NVL", Generation.HOPPER),
        ("NVIDIA RTX A6000", "RTX-A6000", Generation.AMPERE),
        ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada", Generation.ADA),
        ("NVIDIA L40S", "L40S", Generation.ADA),
        ("AMD Instinct MI300X", "MI300X", Generation.CDNA3),
        ("NVIDIA B200", "B200", Generation.BLACKWELL),
    ):
        gpu = _gpu(name)
        assert (gpu.key, gpu.generation) == (key, generation)
        assert gpu.board_w and gpu.peak_flops("bf16")


def test_a_power_cap_derates_the_peak_by_the_cube_root_of_its_share() -> None:
    h100 = _gpu("H100-SXM")
    capped = derated(h100, 500)
    assert capped.peak_tflops["bf16"] == pytest.approx(989.4 * (500 / 700) ** (1 / 3), rel=1e-3)
    assert capped.mem_bw_tbs == h100.mem_bw_tbs and capped.power_limit_w == 500
    assert derated(h100, 700) is h100 and derated(h100, None) is h100
    with pytest.raises(PowerLimitError, match="below what"):
        derated(h100, 100)
    with pytest.raises(PowerLimitError, match="no board power"):
        derated(_gpu("GH200-96GB"), 400)
