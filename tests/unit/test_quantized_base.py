"""quantized_base: the rule on hand-made profiles (a timing recorded from the planted QLoRA loop, the planner's
verdicts on a GPU), configs that ask for a quantized base, and the collector on a real tiny Llama loaded
through Transformers' BitsAndBytesConfig with bitsandbytes' CPU backend."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from tests.factories import LLAMA_1B, profile, steps

from pitstop.core.findings import Finding
from pitstop.core.profile import ModelInfo, QuantizedBase, RunProfile
from pitstop.core.vocabulary import CauseId, Severity
from pitstop.diagnose import diagnose
from pitstop.diagnose.causes.quantized_base import FIT_SHARE, LORA_RANK
from pitstop.ingest.load import Inputs, load_run
from pitstop.plan.from_run import setup_for_run
from pitstop.plan.memory import GIB, memory
from pitstop.plan.params import _analytic
from pitstop.plan.planner import largest_micro_batch

# recorded by the probe on this machine from tests/scripts/qlora_loop.py (28 NF4 linears, 64 tokens, fp32)
TIMED = QuantizedBase(
    library="bitsandbytes",
    quant_type="nf4",
    bits=4,
    double_quant=True,
    compute_dtype="float32",
    layers=28,
    params_quantized=16_777_216,
    shapes=[[512, 512], [512, 2048], [2048, 512]],
    set_by="the model's linears (Linear4bit)",
    timed_on="cpu",
    tokens_timed=64,
    quantized_s=0.0286,
    dense_s=0.0179,
    dequant_s=0.0071,
    passes=2,
    micro_batches=1,
    dequant_s_per_step=0.0107,
)
LLAMA_1B_SHAPE = replace(LLAMA_1B, intermediate_size=8192, n_kv_heads=8, params_trainable=11_272_192)


def finding(p: RunProfile) -> Finding | None:
    return next((f for f in diagnose(p).findings if f.cause == CauseId.QUANTIZED_BASE), None)


def qlora_profile(device: str, base: QuantizedBase | None, wall: float, **env: Any) -> RunProfile:
    p = profile(
        device, steps(n=12, wall=wall, rows=8, row_len=1024), model=dataclasses.replace(LLAMA_1B_SHAPE), **env
    )
    p.ranks[0].quantized_base = base
    return p


def test_a_timed_4bit_base_on_a_cpu_is_a_trade_with_its_dequantization_share() -> None:
    f = finding(qlora_profile("cpu", TIMED, wall=0.0107 * 4))  # the dequantization is a quarter of the step
    assert f is not None
    assert f.est_speedup == pytest.approx(1 / (1 - 0.25), rel=1e-3)  # step / (step − dequantization)
    assert f.summary.startswith("You trade speed for memory:")
    assert f.severity is Severity.MEDIUM and f.confidence == pytest.approx(0.85)
    ev = f.evidence
    assert (ev["library"], ev["quant_type"], ev["bits"], ev["layers"]) == ("bitsandbytes", "nf4", 4, 28)
    assert ev["dequant_ms_per_step"] == pytest.approx(10.7) and ev["dequant_share"] == pytest.approx(0.25)
    assert ev["plan"] == "not evaluated: a CPU run has no GPU memory to plan"
    assert "28 quantized linears timed on this CPU" in f.speedup_basis and "64 tokens" in f.speedup_basis
    assert f.fix is not None and "bnb_4bit_compute_dtype=torch.bfloat16" in f.fix.text  # fp32 compute named


def test_a_small_share_is_low_never_high() -> None:
    f = finding(qlora_profile("cpu", TIMED, wall=0.0107 * 50))
    assert (
        f is not None
        and f.severity is Severity.LOW
        and f.est_speedup == pytest.approx(1 / (1 - 0.02), rel=1e-3)
    )


def test_on_a_gpu_the_planner_says_bf16_lora_fits_and_the_larger_micro_batch() -> None:
    p = qlora_profile("cuda", replace(TIMED, timed_on="cuda (NVIDIA H100 80GB HBM3)"), wall=0.0107 * 4)
    f = finding(p)
    assert f is not None
    setup = setup_for_run(p.environment, seq=1024, gpus=1)
    assert setup is not None and setup.method == "lora"
    gpu = 80 * GIB
    bf16 = memory(replace(setup, method="lora"), gpu).total / GIB
    fits = largest_micro_batch(replace(setup, method="qlora"), FIT_SHARE * gpu)
    ev = f.evidence
    assert ev["plan_bf16_lora_gib"] == pytest.approx(bf16, abs=0.01) and ev["plan_gpu_gib"] == 80.0
    assert ev["bf16_lora_fits"] is (bf16 <= FIT_SHARE * 80)
    assert ev["micro_batch"] == 8 and ev["micro_batch_fits_quantized"] == fits
    assert "timed on this GPU" in f.speedup_basis
    assert bf16 <= FIT_SHARE * 80  # a 1B model in bf16 fits an H100 at 8 × 1024 tokens
    assert "it fits, so the memory the quantized base saves is not needed" in f.summary
    assert f.fix is not None and "You trade speed for memory you do not need" in f.fix.text


def test_where_only_the_quantized_base_fits_the_advice_is_to_keep_it() -> None:
    big = ModelInfo(  # a 70B Llama shape on one 80 GB GPU: bf16 weights alone are 130 GiB
        model_type="llama",
        n_layers=80,
        hidden_size=8192,
        n_heads=64,
        head_dim=128,
        n_kv_heads=8,
        vocab_size=128256,
        intermediate_size=28672,
        params_total=70_553_706_496,
        params_embedding=1_050_673_152,
    )
    big.params_trainable = big.params_total  # what a config.json says: the adapters are not known
    p = profile("cuda", steps(n=12, wall=2.0, rows=1, row_len=512), model=big, micro_batch_size=1)
    p.ranks[0].quantized_base = replace(TIMED, dequant_s_per_step=0.6, layers=560)
    f = finding(p)
    assert f is not None and f.evidence["bf16_lora_fits"] is False
    setup = setup_for_run(p.environment, seq=512)
    assert setup is not None
    adapters = _analytic(setup.model, "lora", LORA_RANK).trainable  # adapters assumed when the run trains all
    quantized = memory(replace(setup, method="qlora", lora_params=adapters), 80 * GIB).total / GIB
    assert f.evidence["plan_quantized_gib"] == pytest.approx(quantized, abs=0.01)
    assert "the 4-bit base is what makes this run fit" in f.summary
    assert f.fix is not None and f.fix.text.startswith("Keep the 4-bit base")


def test_no_quantized_linear_under_the_probe_is_no_finding() -> None:
    p = qlora_profile("cpu", None, wall=0.1)
    p.source = "doctor"  # type: ignore[assignment]
    p.ranks[0].environment.quantized_base = QuantizedBase(library="bitsandbytes", bits=4)  # a stale config
    assert finding(p) is None


def test_found_but_not_timed_is_not_estimated() -> None:
    p = qlora_profile(
        "cpu", replace(TIMED, quantized_s=None, dense_s=None, dequant_s_per_step=None), wall=0.1
    )
    f = finding(p)
    assert f is not None and f.est_speedup is None and f.confidence == pytest.approx(0.6)
    assert f.speedup_basis.startswith("not estimated")


def test_the_record_survives_a_saved_profile() -> None:
    p = qlora_profile("cpu", TIMED, wall=0.1)
    p.ranks[0].environment.quantized_base = QuantizedBase(library="torchao", quant_type="int4_weight_only")
    back = RunProfile.from_dict(json.loads(json.dumps(p.to_dict())))
    assert back.ranks[0].quantized_base == TIMED
    assert back.ranks[0].environment.quantized_base == p.ranks[0].environment.quantized_base


# -- configs ------------------------------------------------------------------------------------------------

LLAMA_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": True,
}


def test_a_quantized_checkpoints_config_json_is_a_lower_confidence_finding_with_the_plan(
    tmp_path: Path,
) -> None:
    config = dict(
        LLAMA_CONFIG,
        quantization_config={
            "quant_method": "bitsandbytes",
            "load_in_4bit": True,
            "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_use_double_quant": True,
            "bnb_4bit_compute_dtype": "bfloat16",
        },
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4, "learning_rate": 2e-4}
    (tmp_path / "args.json").write_text(json.dumps({**args, "output_dir": "out", "max_seq_length": 1024}))
    f = finding(
        load_run(
            Inputs(paths=[tmp_path / "config.json", tmp_path / "args.json"], gpu="A10G", configs_only=True)
        )
    )
    assert f is not None and f.est_speedup is None and f.confidence == pytest.approx(0.4)
    ev = f.evidence
    assert (ev["quant_type"], ev["double_quant"], ev["compute_dtype"]) == ("nf4", True, "bfloat16")
    assert ev["set_by"] == "config.json: quantization_config"
    assert ev["micro_batch"] == 4 and isinstance(ev["bf16_lora_fits"], bool)  # planned on the A10G's 24 GB
    assert f.severity is Severity.LOW


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        (
            "axolotl.yaml",
            "base_model: x\nadapter: qlora\nload_in_4bit: true\nmicro_batch_size: 2\nsequence_len: 512\n"
            "sample_packing: true\nbf16: true\ndatasets: []\n",
            ("nf4", 4, True, "bfloat16"),
        ),
        (
            "sft.yaml",
            "output_dir: out\nper_device_train_batch_size: 2\nlearning_rate: 0.0002\nload_in_8bit: true\n"
            "max_steps: 10\n",
            ("int8", 8, None, None),
        ),
        (
            "llamafactory.yaml",
            "stage: sft\nfinetuning_type: lora\ntemplate: llama3\ncutoff_len: 1024\nquantization_bit: 4\n"
            "bf16: true\n",
            ("nf4", 4, True, "bfloat16"),
        ),
    ],
)
def test_training_configs_that_ask_for_a_quantized_base(
    tmp_path: Path, name: str, text: str, expected: tuple[Any, ...]
) -> None:
    (tmp_path / name).write_text(text)
    f = finding(load_run(Inputs(paths=[tmp_path / name], configs_only=True)))
    assert f is not None and f.est_speedup is None
    ev = f.evidence
    assert (ev["quant_type"], ev["bits"], ev["double_quant"], ev["compute_dtype"]) == expected
    assert str(ev["set_by"]).startswith(name)
    assert str(ev["plan"]).startswith("not evaluated")  # no GPU named, no model shape


def test_a_config_without_quantization_is_no_finding(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    assert finding(load_run(Inputs(paths=[tmp_path / "config.json"], gpu="A10G", configs_only=True))) is None
