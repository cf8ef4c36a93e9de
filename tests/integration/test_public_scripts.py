"""`pitstop doctor` on public training scripts written outside this project, unedited and offline: the
Transformers run_clm.py (Trainer) and run_clm_no_trainer.py (Accelerate) examples and Accelerate's
gradient-accumulation example (copies in ../shared/data/scripts), TRL's own sft.py and Lightning's demo
language model (both run from the installed packages). A tiny random model, the GPT-2 tokenizer and local
text stand in for the Hub (tests/public_scripts/setup.py).

Each script runs twice with the same seed, under ``pitstop doctor --full`` and on its own, and the test
holds what pitstop saw against the truth: the framework, the optimizer steps measured, the tokens per
second the script logs itself over the same steps (where it logs them), the tokens of each step, the
padding, the attention implementation, and losses bit-identical with and without pitstop.
docs/public-scripts.md has the figures."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.public_scripts import logs, setup
from tests.public_scripts.running import COMPAT, offline_env, run_twice

pytestmark = pytest.mark.slow

WARMUP = 3
STEPS = 12  # optimizer steps each script runs: 9 measured after the warm-up
BATCH, BLOCK = 2, 64


def steps_seen(doc: dict[str, Any]) -> list[int]:
    return [step["index"] for step in doc["profile"]["ranks"][0]["steps"]]


def tokens_per_step(doc: dict[str, Any]) -> set[int]:
    return {step["tokens"] for step in doc["profile"]["ranks"][0]["steps"]}


def summary(script: str, doc: dict[str, Any], logged: float | None) -> None:
    """One line of docs/public-scripts.md's table (shown with ``pytest -s``)."""
    m, env = doc["metrics"], doc["environment"]
    print(
        f"\nSUMMARY | {script} | {env['framework']} | {m['steps_measured']} | {m['tokens_per_s']:.1f} | "
        f"{'-' if logged is None else f'{logged:.1f}'} | {m['padding_frac']:.4f} | "
        f"{env['attn_implementation']} | {[f['cause'] for f in doc['findings']]}"
    )


def known_defects(failures: dict[str, bool]) -> None:
    """Last in a test: the assertions that still fail because of a defect named in the key xfail the test
    (one reason for all), and pass once pitstop is fixed."""
    open_ = [reason for reason, failed in failures.items() if failed]
    if open_:
        pytest.xfail("; ".join(open_))


def test_run_clm_trainer(shared_data: Path, tmp_path: Path) -> None:
    model = setup.model_folder(shared_data, tmp_path / "model")
    text = setup.text_file(shared_data, tmp_path / "train.txt", 200)
    script = shared_data / "scripts" / "transformers__run_clm.py"
    command = [*COMPAT, str(script), "--config_name", str(model), "--tokenizer_name", str(model)]
    command += ["--train_file", str(text), "--do_train", "--output_dir", "{work}/out", "--seed", "0"]
    command += ["--per_device_train_batch_size", str(BATCH), "--block_size", str(BLOCK)]
    command += ["--max_steps", str(STEPS), "--logging_steps", "1", "--include_num_input_tokens_seen", "true"]
    command += ["--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true", "--use_cpu"]
    runs = run_twice(tmp_path, command, WARMUP, offline_env(tmp_path))

    doc, m, env = runs.doc, runs.doc["metrics"], runs.doc["environment"]
    observed, plain = (tmp_path / name / "out" / "trainer_state.json" for name in ("observed", "plain"))
    assert env["framework"] == "hf_trainer"
    assert steps_seen(doc) == list(range(WARMUP + 1, STEPS + 1))
    assert tokens_per_step(doc) == {BATCH * BLOCK}  # texts grouped into blocks of 64
    logged = logs.trainer_window_tokens_per_s(observed, WARMUP + 1, STEPS)
    summary("run_clm.py", doc, logged)
    assert m["tokens_per_s"] == pytest.approx(logged, rel=0.10)
    assert m["padding_frac"] == 0.0
    assert env["attn_implementation"] == "sdpa"
    assert logs.trainer_losses(observed) == logs.trainer_losses(plain)
    known_defects(
        {
            "the script's final save_model after the last step is reported as a checkpoint stall inside "
            "the measured window (checkpoint_stall)": "checkpoint_stall" in causes(doc)
        }
    )


def causes(doc: dict[str, Any]) -> list[str]:
    return [f["cause"] for f in doc["findings"]]


def test_run_clm_no_trainer_accelerate(shared_data: Path, tmp_path: Path) -> None:
    model = setup.model_folder(shared_data, tmp_path / "model")
    text = setup.text_file(shared_data, tmp_path / "train.txt", 200)
    script = shared_data / "scripts" / "transformers__run_clm_no_trainer.py"
    command = [*COMPAT, str(script), "--model_name_or_path", str(model), "--train_file", str(text)]
    command += ["--per_device_train_batch_size", str(BATCH), "--block_size", str(BLOCK)]
    command += ["--max_train_steps", str(STEPS), "--seed", "0", "--output_dir", "{work}/out"]
    runs = run_twice(tmp_path, command, WARMUP, offline_env(tmp_path))

    doc, m, env = runs.doc, runs.doc["metrics"], runs.doc["environment"]
    summary("run_clm_no_trainer.py", doc, None)
    assert env["framework"] == "accelerate"
    assert steps_seen(doc) == list(range(WARMUP + 1, STEPS + 1))
    assert tokens_per_step(doc) == {BATCH * BLOCK}  # it logs no tokens/s: the blocks' size is the truth
    assert m["padding_frac"] == 0.0
    assert env["attn_implementation"] == "sdpa"
    # it logs no per-step loss, only the eval perplexity after training; the weights it saves are the
    # whole training's result: both must be identical
    assert logs.no_trainer_perplexities(runs.observed) == logs.no_trainer_perplexities(runs.plain) != []
    weights = [(tmp_path / n / "out" / "model.safetensors").read_bytes() for n in ("observed", "plain")]
    assert weights[0] == weights[1]
    known_defects({"checkpoint_stall on the save after training": "checkpoint_stall" in causes(doc)})


def test_accelerate_gradient_accumulation_example(shared_data: Path, tmp_path: Path) -> None:
    non_empty, accumulation = 16, 2  # 4 updates an epoch; the script runs 3 epochs: 12 optimizer steps
    script = shared_data / "scripts" / "accelerate__gradient_accumulation_for_autoregressive_models.py"
    command = [sys.executable, str(script), "--cpu", "--gradient_accumulation_steps", str(accumulation)]
    runs = run_twice(
        tmp_path,
        command,
        WARMUP,
        offline_env(tmp_path),
        between=lambda folder: setup.hub_shaped(shared_data, folder, non_empty),
    )

    doc, m, env = runs.doc, runs.doc["metrics"], runs.doc["environment"]
    assert env["framework"] == "accelerate"
    assert steps_seen(doc) == list(range(WARMUP + 1, STEPS + 1))
    assert env["attn_implementation"] == "sdpa"
    assert logs.accelerate_example_losses(runs.observed) == logs.accelerate_example_losses(runs.plain)
    assert len(logs.accelerate_example_losses(runs.plain)) == STEPS + 3  # and 3 evals
    # it logs no tokens/s: the truth is what its collator makes of the rows, step by step
    lengths = token_lengths(shared_data, non_empty)
    truth = logs.padded_pairs(lengths, BATCH, accumulation, range(WARMUP + 1, STEPS + 1))
    seen = [(s["tokens"], s["real_tokens"]) for s in doc["profile"]["ranks"][0]["steps"]]
    padding = 1 - sum(real for _, real in truth) / sum(total for total, _ in truth)
    summary("accelerate example", doc, None)
    assert m["padding_frac"] > 0.1  # padded batches
    known_defects(
        {
            f"tokens of each step (positions, real) {seen} where the steps trained on {truth} (the eval "
            "batch between epochs counted in the next step, later steps one micro-batch late, an epoch's "
            f"last step one micro-batch short); padding_frac {m['padding_frac']:.4f} against "
            f"{padding:.4f}": seen != truth
        }
    )


def token_lengths(shared: Path, count: int) -> list[int]:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(shared / "tokenizers" / "gpt2_tokenizer.json"))
    return [len(tok(text)["input_ids"]) for text in setup.gsm8k_texts(shared, count)]


def test_trl_sft_script(shared_data: Path, tmp_path: Path) -> None:
    model = setup.model_folder(shared_data, tmp_path / "model")
    data = tmp_path / "alpaca"
    data.mkdir()
    setup.alpaca_messages(shared_data, data / "train.jsonl", 200)
    command = [sys.executable, "-m", "trl.scripts.sft", "--model_name_or_path", str(model)]
    command += ["--dataset_name", str(data), "--output_dir", "{work}/out", "--seed", "0"]
    command += ["--per_device_train_batch_size", str(BATCH), "--packing", "--max_length", str(BLOCK)]
    command += ["--max_steps", str(STEPS), "--logging_steps", "1", "--include_num_input_tokens_seen", "true"]
    command += ["--save_strategy", "steps", "--save_steps", str(STEPS), "--report_to", "none"]
    command += ["--disable_tqdm", "true", "--use_cpu"]
    runs = run_twice(tmp_path, command, WARMUP, offline_env(tmp_path))

    doc, m, env = runs.doc, runs.doc["metrics"], runs.doc["environment"]
    observed, plain = (
        tmp_path / name / "out" / f"checkpoint-{STEPS}" / "trainer_state.json"
        for name in ("observed", "plain")
    )
    assert env["framework"] == "trl"
    assert steps_seen(doc) == list(range(WARMUP + 1, STEPS + 1))
    logged = logs.trainer_window_tokens_per_s(observed, WARMUP + 1, STEPS)
    summary("trl sft.py", doc, logged)
    assert m["tokens_per_s"] == pytest.approx(logged, rel=0.10)
    assert m["padding_frac"] == 0.0  # packed
    assert env["attn_implementation"] == "sdpa"
    assert logs.trainer_losses(observed) == logs.trainer_losses(plain)


def test_lightning_demo_transformer(shared_data: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "tests.public_scripts.lightning_demo", str(STEPS), "{work}/losses.json"]
    runs = run_twice(
        tmp_path,
        command,
        WARMUP,
        offline_env(tmp_path),
        between=lambda folder: setup.wikitext_file(shared_data, folder, 200),
    )

    doc, m, env = runs.doc, runs.doc["metrics"], runs.doc["environment"]
    summary("lightning demo", doc, None)
    assert env["framework"] == "lightning"
    assert steps_seen(doc) == list(range(WARMUP + 1, STEPS + 1))
    assert tokens_per_step(doc) == {35}  # the demo's DataLoader: one block of 35 words a step
    assert m["padding_frac"] == 0.0
    losses = [(tmp_path / n / "losses.json").read_text() for n in ("observed", "plain")]
    assert losses[0] == losses[1]
    known_defects(
        {
            f"attention reported {env['attn_implementation']!r}: nn.Transformer's MultiheadAttention "
            "(need_weights=False) runs scaled_dot_product_attention": env["attn_implementation"] != "sdpa"
        }
    )
