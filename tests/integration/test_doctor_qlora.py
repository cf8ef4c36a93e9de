"""Zero-code `pitstop doctor` on a real QLoRA loop (Transformers' BitsAndBytesConfig, bitsandbytes' CPU backend,
PEFT's LoRA): quantized_base found from the model's own linears and timed in the job after its window."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import causes, doctor_json

pytestmark = pytest.mark.slow
pytest.importorskip(
    "bitsandbytes", reason="bitsandbytes not installed (the dev extra; a QLoRA job brings its own)"
)


def test_a_4bit_base_is_found_timed_and_said_as_a_trade(tmp_path: Path) -> None:
    doc, _ = doctor_json(tmp_path, "qlora_loop.py", "--steps", "40")
    assert "quantized_base" in causes(doc)
    f = next(f for f in doc["findings"] if f["cause"] == "quantized_base")
    ev = f["evidence"]
    assert (ev["library"], ev["quant_type"], ev["bits"], ev["double_quant"]) == (
        "bitsandbytes",
        "nf4",
        4,
        True,
    )
    assert ev["layers"] == 28 and ev["params_quantized"] == 4 * (4 * 512 * 512 + 3 * 512 * 2048)
    assert ev["timed_on"] == "cpu" and ev["tokens_timed"] == 64  # 2 rows × 32 tokens, the job's micro-batch
    assert ev["quantized_ms_per_micro_batch"] > 0 and ev["dense_ms_per_micro_batch"] > 0
    assert ev["plan"] == "not evaluated: a CPU run has no GPU memory to plan"
    assert f["severity"] in ("low", "medium") and f["summary"].startswith("You trade speed for memory:")
    assert f["est_speedup"] is not None and "28 quantized linears timed on this CPU" in f["speedup_basis"]
    assert doc["profile"]["ranks"][0]["quantized_base"]["passes"] == 2


def test_the_same_loop_on_a_dense_base_has_no_quantized_base(tmp_path: Path) -> None:
    doc, _ = doctor_json(tmp_path, "qlora_loop.py", "--steps", "40", "--base", "dense")
    assert "quantized_base" not in causes(doc)
    assert doc["profile"]["ranks"][0].get("quantized_base") is None
