"""The quantized-base collector on a real tiny Llama loaded through Transformers' BitsAndBytesConfig (4-bit NF4,
bitsandbytes' CPU backend) with PEFT's LoRA on it: the linears found and counted, the dense comparator computing
what the quantized layer computes, and the timing run on this CPU through the collector's own calls."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from tests.conftest import SCRIPTS

from pitstop.core.profile import Environment, RankProfile, StepRecord
from pitstop.core.vocabulary import Device
from pitstop.probe.collectors.base import ProbeContext
from pitstop.probe.collectors.quantized import (
    QuantizedCollector,
    dense_weight,
    quantized_linears,
    tokens_per_micro_batch,
)

pytestmark = pytest.mark.slow  # real model loads through Transformers (~20 s in all)
pytest.importorskip(
    "bitsandbytes", reason="bitsandbytes not installed (the dev extra; a QLoRA job brings its own)"
)
pytest.importorskip("peft", reason="peft not installed (the hf extra)")
sys.path.insert(0, str(SCRIPTS))
from qlora_loop import qlora_model  # noqa: E402

LAYERS, HIDDEN = 2, 64


@pytest.fixture(scope="module")
def qlora() -> Any:
    return qlora_model("4bit", "float32", hidden=HIDDEN, layers=LAYERS)


def test_every_quantized_linear_of_the_base_is_found_behind_the_adapters(qlora: Any) -> None:
    found = quantized_linears(qlora)
    assert len(found) == 7 * LAYERS  # q, k, v, o, gate, up, down per layer; lm_head stays dense
    assert {type(q.module).__name__ for q in found} == {"Linear4bit"}
    assert {(q.out_features, q.in_features) for q in found} == {(64, 64), (256, 64), (64, 256)}
    assert all(q.bits == 4 and q.quant_type == "nf4" for q in found)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_the_dense_comparator_computes_what_the_quantized_layer_computes(mode: str) -> None:
    """In eval mode without grad bitsandbytes repacks a CPU weight in place for its inference kernel: the
    comparator reads it back through bitsandbytes' inverse (that kernel computes in bf16: bf16's tolerance)."""
    model = qlora_model("4bit", "float32", hidden=HIDDEN, layers=1)
    model.train(mode == "train")
    layer = quantized_linears(model)[0]
    x = torch.randn(8, layer.in_features, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = layer.module(x)
        dense = torch.nn.functional.linear(x, dense_weight(layer, torch.float32))
    tolerance = {"rtol": 1e-4, "atol": 1e-5} if mode == "train" else {"rtol": 1.6e-2, "atol": 1e-2}
    torch.testing.assert_close(dense, expected, **tolerance)


def test_the_collector_counts_then_times_after_the_window(qlora: Any) -> None:
    errors: list[str] = []
    ctx = ProbeContext(
        config=None,  # type: ignore[arg-type]
        origin=0.0,
        hooks=None,  # type: ignore[arg-type]
        errors=errors,
        disable=lambda exc: None,
        step_index=lambda: 1,
    )
    ctx.model, ctx.device = qlora, torch.device("cpu")
    ctx.environment = Environment(device=Device.CPU)
    collector = QuantizedCollector(ctx)
    collector.begin()
    draft = RankProfile(
        steps=[
            StepRecord(index=i, wall_s=0.05, micro_batches=2, tokens=2 * 4 * 32, seq_len=32) for i in range(4)
        ],
        environment=Environment(device=Device.CPU, gradient_checkpointing=True),
    )
    assert tokens_per_micro_batch(draft) == (128, 2)
    collector.fill(draft)  # a window that does not end the job (watch): counted, not timed
    base = draft.quantized_base
    assert base is not None and base.layers == 7 * LAYERS and base.quantized_s is None
    assert base.params_quantized == LAYERS * (4 * 64 * 64 + 3 * 64 * 256)
    assert base.double_quant is True and base.compute_dtype == "float32"
    state = torch.random.get_rng_state()
    collector.closing()
    collector.fill(draft)
    base = draft.quantized_base
    assert errors == []
    assert base is not None and base.timed_on == "cpu" and base.tokens_timed == 128
    assert base.quantized_s and base.dense_s and base.dequant_s  # every path ran
    assert base.passes == 3 and base.micro_batches == 2  # the checkpointed recompute counts
    assert base.dequant_s_per_step == pytest.approx(max(0.0, base.quantized_s - base.dense_s) * 2)
    assert torch.equal(torch.random.get_rng_state(), state)  # the job's random state untouched


def test_a_dense_model_has_no_quantized_base() -> None:
    dense = qlora_model("dense", "float32", hidden=HIDDEN, layers=1)
    assert quantized_linears(dense) == []
    ctx = ProbeContext(
        config=None,  # type: ignore[arg-type]
        origin=0.0,
        hooks=None,  # type: ignore[arg-type]
        errors=[],
        disable=lambda exc: None,
        step_index=lambda: 1,
    )
    ctx.model = dense
    collector = QuantizedCollector(ctx)
    collector.begin()
    draft = RankProfile()
    collector.fill(draft)
    assert draft.quantized_base is None
