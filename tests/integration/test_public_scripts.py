"""`pitstop doctor` on public training scripts written outside this project, unedited and offline: the
Transformers run_clm.py (Trainer) and run_clm_no_trainer.py (Accelerate) examples and Accelerate's
gradient-accumulation example (copies in ../shared/data/scripts), TRL's own sft.py and Lightning's demo
language model (both run from the installed packages). A tiny random model, the GPT-2 tokenizer and local
text stand in for the Hub (tests/public_scripts/setup.py).

Each script runs twice with the same seed, at the same time: under ``pitstop doctor --full`` and on its own,
and the test holds what pitstop saw against the truth: the framework, the optimizer steps measured, the
tokens per second the script logs itself over the same steps (where it logs them), the tokens of each step,
the padding, the attention implementation, no checkpoint stall from a save after the last step, and losses
bit-identical with and without pitstop. docs/public-scripts.md has the figures.

Cost: 8 steps a script (2 warm-up, 6 measured: enough to span epochs, evaluations and a save), the tiny
model built once for the module, and the run without pitstop beside the observed one, not after it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_shared
from tests.public_scripts import logs, setup
from tests.public_scripts.running import COMPAT, offline_env, run_twice

pytestmark = pytest.mark.slow

WARMUP = 2
STEPS = 8  # optimizer steps each script runs: 6 measured after the warm-up
BATCH, BLOCK = 2, 64
TEXTS = 100  # lines of text: more blocks of 64 tokens than the steps take


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama and its tokenizer, built once: every script only reads it."""
    return setup.model_folder(require_shared(), tmp_path_factory.mktemp("model"))


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


def test_run_clm_trainer(shared_data: Path, tiny_model: Path, tmp_path: Path) -> None:
    model = tiny_model
    text = setup.text_file(shared_data, tmp_path / "train.txt", TEXTS)
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
    # its final save_model comes after the last step: no measured step waited for it
    assert "checkpoint_stall" not in causes(doc)
    assert doc["profile"]["ranks"][0]["checkpoints"]["saves"] == 0


def causes(doc: dict[str, Any]) -> list[str]:
    return [f["cause"] for f in doc["findings"]]


def test_run_clm_no_trainer_accelerate(shared_data: Path, tiny_model: Path, tmp_path: Path) -> None:
    model = tiny_model
    text = setup.text_file(shared_data, tmp_path / "train.txt", TEXTS)
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
    assert "checkpoint_stall" not in causes(doc)  # it saves after training, outside every step


def test_accelerate_gradient_accumulation_example(
    shared_data: Path, tiny_model: Path, tmp_path: Path
) -> None:
    non_empty, accumulation = 8, 2  # 2 updates an epoch; the script runs 3 epochs: 6 optimizer steps
    steps = 3 * non_empty // (BATCH * accumulation)
    script = shared_data / "scripts" / "accelerate__gradient_accumulation_for_autoregressive_models.py"
    command = [sys.executable, str(script), "--cpu", "--gradient_accumulation_steps", str(accumulation)]
    runs = run_twice(
        tmp_path,
        command,
        WARMUP,
        offline_env(tmp_path),
        between=lambda folder: setup.hub_shaped(shared_data, folder, non_empty, tiny_model),
    )

    doc, m, env = runs.doc, runs.doc["metrics"], runs.doc["environment"]
    assert env["framework"] == "accelerate"
    assert steps_seen(doc) == list(range(WARMUP + 1, steps + 1))  # 3…6: two epochs begin in the window
    assert env["attn_implementation"] == "sdpa"
    assert logs.accelerate_example_losses(runs.observed) == logs.accelerate_example_losses(runs.plain)
    assert len(logs.accelerate_example_losses(runs.plain)) == steps + 3  # and 3 evals
    # it logs no tokens/s: the truth is what its collator makes of the rows, step by step; each step takes
    # its two micro-batches with next() before the first forward, and an eval batch is read between epochs
    lengths = token_lengths(shared_data, non_empty)
    truth = logs.padded_pairs(lengths, BATCH, accumulation, range(WARMUP + 1, steps + 1))
    seen = [(s["tokens"], s["real_tokens"]) for s in doc["profile"]["ranks"][0]["steps"]]
    padding = 1 - sum(real for _, real in truth) / sum(total for total, _ in truth)
    summary("accelerate example", doc, None)
    assert seen == truth
    assert m["padding_frac"] == pytest.approx(padding, abs=1e-4)
    assert m["padding_frac"] > 0.1  # padded batches


def token_lengths(shared: Path, count: int) -> list[int]:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(shared / "tokenizers" / "gpt2_tokenizer.json"))
    return [len(tok(text)["input_ids"]) for text in setup.gsm8k_texts(shared, count)]


def test_trl_sft_script(shared_data: Path, tiny_model: Path, tmp_path: Path) -> None:
    model = tiny_model
    data = tmp_path / "alpaca"
    data.mkdir()
    setup.alpaca_messages(shared_data, data / "train.jsonl", TEXTS)
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
    assert "checkpoint_stall" not in causes(doc)  # its one checkpoint comes after the last step


def test_lightning_demo_transformer(shared_data: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "tests.public_scripts.lightning_demo", str(STEPS), "{work}/losses.json"]
    runs = run_twice(
        tmp_path,
        command,
        WARMUP,
        offline_env(tmp_path),
        between=lambda folder: setup.wikitext_file(shared_data, folder, TEXTS),
    )

    doc, m, env = runs.doc, runs.doc["metrics"], runs.doc["environment"]
    summary("lightning demo", doc, None)
    assert env["framework"] == "lightning"
    assert steps_seen(doc) == list(range(WARMUP + 1, STEPS + 1))
    assert tokens_per_step(doc) == {35}  # the demo's DataLoader: one block of 35 words a step
    assert m["padding_frac"] == 0.0
    losses = [(tmp_path / n / "losses.json").read_text() for n in ("observed", "plain")]
    assert losses[0] == losses[1]
    # nn.Transformer's MultiheadAttention layers call it with need_weights=False: scaled_dot_product_attention
    assert env["attn_implementation"] == "sdpa (nn.MultiheadAttention)"
    assert env["attention"]["sdpa_calls"] > 0
