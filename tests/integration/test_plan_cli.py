"""`pitstop plan` end to end: a JSON plan a script can read, a config.json folder as the model, the
fake-tensor cross-check, and one-line errors with exit code 2 for impossible or unknown input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_pitstop

pytestmark = pytest.mark.slow


def _plan(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "plan.json"
    proc = run_pitstop("plan", *args, "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


@pytest.mark.smoke
def test_8b_on_one_h100_does_not_fit_and_lora_does(tmp_path: Path) -> None:
    doc = _plan(tmp_path, "--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--seq", "4096", "--no-simulate")
    assert doc["schema"] == "pitstop.plan/1"
    assert doc["params"]["total"] == 8_030_261_248 and doc["params"]["exact"]
    assert not doc["fits"] and doc["memory_gib"]["total"] > 80
    fitting = {a["change"] for a in doc["alternatives"] if a["fits"]}
    assert any("lora" in c.lower() for c in fitting), doc["alternatives"]
    low, high = doc["tokens_per_s_expected"]
    assert 0 < low < high < doc["tokens_per_s_at_100pct_mfu"]


def test_auto_micro_batch_splits_the_global_batch(tmp_path: Path) -> None:
    doc = _plan(
        tmp_path,
        *("--model", "llama-3.1-8b", "--gpu", "A100-80GB", "--gpus", "8", "--zero", "3"),
        *(
            "--method",
            "lora",
            "--seq",
            "2048",
            "--micro-batch",
            "auto",
            "--global-batch",
            "128",
            "--no-simulate",
        ),
    )
    micro, accum = doc["setup"]["micro_batch"], doc["gradient_accumulation"]
    assert doc["fits"] and micro == doc["max_micro_batch"] >= 1
    assert micro * accum * 8 == 128  # 8 GPUs x micro-batch x accumulation steps = the global batch


def test_16_gpus_on_2_nodes_under_zero3_shows_communication(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    args = ("--model", "llama-3.1-8b", "--gpus", "16", "--nodes", "2", "--zero", "3", "--no-simulate")
    proc = run_pitstop("plan", *args, "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    comm = doc["communication"]
    assert doc["setup"]["zero"] == 3 and doc["setup"]["nodes"] == 2 and doc["gpus"] == 16
    assert comm["strategy"] == "full_shard" and comm["links_busbw_gbps"] == {"nvlink4": 360.0, "ib_ndr": 40.0}
    # 3 × 15/16 × 16.06 GB of bf16 weights / gradients, all across nodes at 40 GB/s
    assert comm["gb_on_the_bus_per_step"] == pytest.approx(45.17, abs=0.01)
    assert comm["gb_across_nodes_per_step"] == comm["gb_on_the_bus_per_step"]
    assert comm["comm_s_per_step"] == pytest.approx(1.129, abs=0.001)
    assert comm["compute_s_per_step"] > 0 and 0 < comm["comm_share_if_not_hidden"] < 1
    options = {o["strategy"]: o for o in comm["options"]}
    assert options["hybrid_shard"]["fits"] and options["hybrid_shard"]["comm_s"] < comm["comm_s_per_step"]
    text = " ".join(proc.stdout.split())
    assert "Communication per optimizer step (full_shard" in text and "over 2 nodes" in text
    assert "hybrid_shard" in text and "stays exposed" in text


def test_model_folder_and_fake_tensor_cross_check(tmp_path: Path) -> None:
    folder = tmp_path / "tiny"
    folder.mkdir()
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "vocab_size": 4096,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": False,
    }
    (folder / "config.json").write_text(json.dumps(config))
    doc = _plan(tmp_path, "--model", str(folder), "--gpu", "L4", "--seq", "512", "--micro-batch", "4")
    held = doc["held_after_forward_gib"]
    assert held["simulated"] > 0
    assert held["formula"] == pytest.approx(held["simulated"], rel=0.15)
    assert doc["fits"] and doc["params"]["exact"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "llama-3.1-8b", "--gpu", "H999"], "unknown GPU 'H999'; pitstop knows: A100-40GB"),
        (["--model", "no-such-model"], "neither a config.json, a model folder, nor a preset (bloomz-7b1"),
        (["--model", "llama-3.1-8b", "--zero", "2", "--offload", "param"], "offload_param needs ZeRO-3"),
        (["--model", "llama-3.1-8b", "--micro-batch", "many"], "--micro-batch is a number or auto"),
        (["--model", "llama-3.1-8b", "--gpus", "3", "--global-batch", "128"], "does not split evenly over 3"),
        (
            ["--model", "llama-3.1-8b", "--gpus", "12", "--nodes", "5"],
            "12 GPUs do not split evenly over 5 nodes",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpus", "8", "--sharding", "sideways"],
            "--sharding is one of no_shard",
        ),
        (["--model", "llama-3.1-8b", "--gpus", "8", "--network", "pigeon"], "unknown --network 'pigeon'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    proc = run_pitstop("plan", *args, "--no-simulate")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_config_that_misses_fields(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    proc = run_pitstop("plan", "--model", str(bad), "--no-simulate")
    assert proc.returncode == 2 and proc.stderr.startswith("pitstop: --model:"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_zero3_on_one_gpu_is_allowed_with_a_note(tmp_path: Path) -> None:
    doc = _plan(tmp_path, "--model", "qwen2-0.5b", "--gpu", "L4", "--zero", "3", "--no-simulate")
    assert any("ZeRO on one GPU" in note for note in doc["notes"])
