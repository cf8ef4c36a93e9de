"""pitstop plan: exact parameter counts, DeepSpeed's model-state formulas, activations vs a fake-tensor
simulation of a real step, and the decisions built on them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pitstop.core.profile import ModelInfo
from pitstop.hardware import lookup_gpu
from pitstop.plan.memory import GIB, Setup, activations, held_after_forward, memory, model_states
from pitstop.plan.model_shape import model_info_from_config
from pitstop.plan.params import count_params, presets, resolve_model
from pitstop.plan.planner import PlanError, make_plan, model_info

MLC_PRESETS = [
    "llama2_7b",
    "llama3_1_8b",
    "llama3_2_1b",
    "mistral_7b_v03",
    "Mixtral-8x7B-v0.1",
    "qwen2_0_5b",
    "qwen2_7b",
    "qwen3_1.7b",
    "gemma_2b",
    "gemma2_9b",
    "phi-3_5",
    "gpt2_medium",
    "smollm2_360m",
]


@pytest.mark.parametrize("name", MLC_PRESETS)
def test_parameter_counts_exact_against_the_instantiated_model(shared_data: Path, name: str) -> None:
    pytest.importorskip("transformers")
    config = json.loads((shared_data / "configs" / "model_presets_mlc_llm.json").read_text())[name]
    built = count_params(config)  # the model built on the meta device
    assert built.exact
    assert model_info_from_config(config).params_total == built.total  # the formula pitstop falls back to


def test_lora_counts_are_peft_counts() -> None:
    pytest.importorskip("peft")
    config = resolve_model("llama-3.2-1b")[1]
    lora = count_params(config, "lora", rank=16)
    # all-linear targets: per layer r·(in+out) for q, k, v, o, gate, up, down; 16 layers
    d, kv, inter = 2048, 512, 8192
    per_layer = 16 * ((d + d) + 2 * (d + kv) + (d + d) + 2 * (d + inter) + (inter + d))
    assert lora.trainable == 16 * per_layer and lora.total == 1_235_814_400  # the base model's own count


def _ds_zero2(p: int, n: int, offload: bool) -> float:
    """DeepSpeed estimate_zero2_model_states_mem_needs, GPU side."""
    return 2 * p if offload else 4 * p + int(16 * p / n)


def _ds_zero3(p: int, largest: int, n: int, offload: bool, offload_params: bool) -> float:
    """DeepSpeed estimate_zero3_model_states_mem_needs, GPU side."""
    if offload and offload_params:
        return 4 * largest
    if offload:
        return 4 * largest + int(2 * p / n)
    return 4 * largest + int(18 * p / n)


def _setup(**kw: Any) -> Setup:
    base = dict(
        model=shape_stub(),
        lora_params=41_943_040,
        largest_module=525_336_576,
        seq=4096,
    )
    return Setup(**{**base, **kw})


@pytest.mark.parametrize("gpus", [1, 2, 8, 64])
def test_model_states_equal_deepspeed_estimators(gpus: int) -> None:
    for offload in (False, True):
        w, g, o, _ = model_states(_setup(gpus=gpus, zero=2, offload="optimizer" if offload else "none"))
        assert w + g + o == pytest.approx(_ds_zero2(8_030_261_248, gpus, offload), abs=1)
    for offload, params in ((False, False), (True, False), (True, True)):
        mode = "param" if params else ("optimizer" if offload else "none")
        w, g, o, _ = model_states(_setup(gpus=gpus, zero=3, offload=mode))
        expected = _ds_zero3(8_030_261_248, 525_336_576, gpus, offload, params)
        assert w + g + o == pytest.approx(expected, abs=1)
    w, g, o, _ = model_states(_setup(zero=0))
    assert w + g + o == 16 * 8_030_261_248  # the classic 2 + 2 + 12 bytes per parameter


CASES = [
    ("llama-3.2-1b", 2, 512, False),
    ("llama-3.2-1b", 1, 2048, False),
    ("llama-3.2-1b", 4, 1024, True),
    ("qwen2-0.5b", 2, 1024, False),
    ("qwen2-0.5b", 1, 4096, True),
    ("gemma-2b", 1, 1024, False),
    ("gemma-2b", 2, 512, True),
    ("smollm2-135m", 8, 512, False),
]


@pytest.mark.parametrize(("name", "batch", "seq", "checkpointing"), CASES)
def test_activation_formula_within_10pct_of_the_simulated_step(
    name: str, batch: int, seq: int, checkpointing: bool
) -> None:
    pytest.importorskip("transformers")
    from pitstop.plan.simulate import simulate_step

    config = resolve_model(name)[1]
    s = Setup(model_info_from_config(config), seq=seq, micro_batch=batch, checkpointing=checkpointing)
    simulated = simulate_step(config, batch, seq, "sdpa", checkpointing).activations
    assert held_after_forward(s) == pytest.approx(simulated, rel=0.10)


def test_eager_attention_costs_the_square_of_the_sequence() -> None:
    s = _setup(seq=2048)
    assert activations(replace(s, attn="eager")) - activations(s) == pytest.approx(
        s.micro_batch * 2048 * 32 * 6 * 32 * 2048
    )  # 6 bytes per head per key per token, every layer


def _plan(**kw: Any) -> Any:
    config = resolve_model("llama-3.1-8b")[1]
    params = count_params(config, kw.get("method", "full"))
    lora = count_params(config, "lora").trainable
    s = Setup(
        model=model_info(params, model_info_from_config(config)),
        lora_params=lora,
        largest_module=params.largest_module,
        seq=kw.pop("seq", 4096),
        **{k: v for k, v in kw.items() if k != "auto"},
    )
    gpu = lookup_gpu(kw.get("gpu_name", "H100-SXM"))
    return make_plan("llama-3.1-8b", gpu, s, params, global_batch=64, auto_micro_batch=kw.get("auto", False))


def test_full_fine_tune_of_8b_on_one_h100_needs_a_change() -> None:
    pytest.importorskip("transformers")
    plan = _plan()
    assert not plan.fits and plan.needs_offload and plan.max_micro_batch == 0
    fitting = [a for a in plan.alternatives if a.fits]
    assert fitting and fitting[0].change.startswith("LoRA")  # the cheapest change that fits comes first
    doc = plan.to_dict()
    for key in (
        "params",
        "memory_gib",
        "gpu_memory_gib",
        "fits",
        "needs_offload",
        "max_micro_batch",
        "gradient_accumulation",
        "alternatives",
        "flops_per_token",
        "tokens_per_s_at_100pct_mfu",
        "tokens_per_s_expected",
    ):
        assert key in doc
    assert doc["schema"] == "pitstop.plan/1"
    assert doc["params"]["total"] == 8_030_261_248 and doc["params"]["trainable"] == 8_030_261_248


def test_zero3_over_eight_gpus_fits_and_finds_a_batch() -> None:
    pytest.importorskip("transformers")
    plan = _plan(gpus=8, zero=3, auto=True)
    assert plan.fits and plan.max_micro_batch >= 1
    assert plan.gradient_accumulation == -(-64 // (plan.max_micro_batch * 8))
    assert plan.mem.total <= 80 * GIB


def test_offload_costs_are_reported_and_unneeded_offload_is_called_so() -> None:
    pytest.importorskip("transformers")
    plan = _plan(gpus=8, zero=3, offload="optimizer", micro_batch=1)
    assert (
        plan.offload is not None and plan.offload["pcie_gb_per_step"] > 0 and plan.offload["est_slowdown"] > 1
    )
    assert any("fits without offload" in n for n in plan.notes)


def test_impossible_combinations() -> None:
    s = _setup()
    gpu = lookup_gpu("H100-SXM")
    for bad in (
        replace(s, zero=2, offload="param"),
        replace(s, zero=0, offload="optimizer"),
        replace(s, zero=4),
    ):
        with pytest.raises(PlanError):
            make_plan("m", gpu, bad, count_params_stub())
    assert memory(s, 80 * GIB).total > 0


def count_params_stub() -> Any:
    from pitstop.plan.params import ParamCounts

    return ParamCounts(
        total=8_030_261_248,
        embedding=525_336_576,
        trainable=8_030_261_248,
        largest_module=525_336_576,
        exact=False,
    )


def shape_stub() -> ModelInfo:
    """Llama-3.1-8B's shape and counts."""
    return ModelInfo(
        n_layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        n_heads=32,
        head_dim=128,
        n_kv_heads=8,
        vocab_size=128256,
        params_total=8_030_261_248,
        params_embedding=525_336_576,
    )


def test_presets_ship_and_resolve() -> None:
    names = presets()
    assert {"llama-3.1-8b", "qwen2-7b", "mistral-7b", "gemma2-9b", "smollm2-135m"} <= set(names)
    assert all(v.get("_source") for v in names.values())


def test_the_margin_grows_with_what_the_run_adds() -> None:
    one = memory(_setup(), 80 * GIB)
    eight = memory(_setup(gpus=8, zero=3), 80 * GIB)
    graphs = memory(_setup(cuda_graphs=True), 80 * GIB)
    from pitstop.plan.memory import CONTEXT_BYTES, FRAGMENTATION, NCCL_BASE_BYTES

    tensors = eight.total - eight.margin
    assert eight.margin == pytest.approx(
        CONTEXT_BYTES + FRAGMENTATION * tensors + NCCL_BASE_BYTES
    )  # NCCL's buffers once a process group spans GPUs
    assert graphs.margin > one.margin + 0.2 * one.activations  # a captured graph's private pool


def test_plan_is_built_outside_the_cli_and_an_offload_plan_renders() -> None:
    import io

    from rich.console import Console

    from pitstop.cli.plan import render_plan
    from pitstop.plan.build import PlanRequest, build_plan

    plan = build_plan(PlanRequest(model="qwen2-0.5b", gpu="L4", seq=512, zero=2, offload="optimizer"))
    assert plan.offload is not None and plan.gpu.memory_mib == 23034
    out = io.StringIO()
    render_plan(plan, Console(file=out, width=200))  # raised KeyError 'compute_s_per_micro_batch' before
    assert "offload:" in out.getvalue() and "s of compute" in out.getvalue()
    with pytest.raises(PlanError, match="unknown GPU 'H999'"):
        build_plan(PlanRequest(model="qwen2-0.5b", gpu="H999"))
