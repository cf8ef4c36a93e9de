"""Issue 42, items 1, 2 and 5: every snippet the padding fixes print for a Trainer job is executed against the
real code path, on the newcomer's job (``tests/scripts/newcomer_trainer.py``: rows padded to ``max_length``
by the tokenizer, ``DataCollatorForLanguageModeling``, eager attention), and ``doctor`` on that job proposes
the one-line change at the job's own line first.

* the drop-the-argument change, applied to a copy of the job as the snippet says: the job trains with a loss;
* the collator advised where the job's is not a per-batch one: a causal-LM dataset without labels trains
  (where ``DataCollatorForSeq2Seq``, the old advice, ends in "The model did not return a loss");
* the kept ``pack`` and ``pack_batch`` changes: they train, and each batch's loss is the loss of the same
  examples unpacked (they keep every example and labelled token; attention stays inside each example)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies import remedy
from pitstop.tune.proposals import kept_change

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "scripts" / "newcomer_trainer.py"
LM = "DataCollatorForLanguageModeling"
WIDTH = 64  # the job's max_length in these runs: short rows keep the CPU trainings quick

pytestmark = pytest.mark.slow


def _padding_line(script: Path) -> tuple[int, str]:
    """(1-based line, code) of the job's tokenizer call that pads to max_length."""
    lines = script.read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if 'padding="max_length"' in line)
    return number, lines[number - 1].strip()


def _losses(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"'loss': '?([0-9.eE+-]+)'?", text)]


def test_the_dropped_argument_applied_to_the_job_trains(tmp_path: Path) -> None:
    job = tmp_path / "newcomer_trainer.py"
    job.write_text(JOB.read_text())
    number, line = _padding_line(job)
    params = {"padded_by": "tokenizer", "padded_to": WIDTH, "site": f"{job}:{number}", "code": line}
    change = kept_change("trim_padding", "hf_trainer", {**params, "collate_fn": LM, "measured": True})
    header, changed, keep = change.snippet.splitlines()
    assert header == f'# {job}:{number}: padding="max_length" dropped' and LM in keep
    # the user's edit: that one line, as the snippet prints it
    lines = job.read_text().splitlines()
    indent = lines[number - 1][: len(lines[number - 1]) - len(lines[number - 1].lstrip())]
    lines[number - 1] = indent + changed
    job.write_text("\n".join(lines) + "\n")
    assert 'padding="max_length"' not in job.read_text()
    env = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, str(job), "--steps", "3", "--batch", "4", "--max-length", str(WIDTH)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    losses = _losses(done.stdout + done.stderr)
    assert len(losses) >= 3 and all(math.isfinite(v) and v > 0 for v in losses), losses


# -- in-process runs: the newcomer's tokenizer, data and model, the snippet exec'd as the user pastes it ----


def _newcomer() -> Any:
    """The newcomer job's own module (its corpus and tokenizer), imported from tests/scripts."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("newcomer_trainer", JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def job() -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM

    newcomer = _newcomer()
    texts = newcomer.corpus(64)
    tok = newcomer.tokenizer_for(texts)
    short = [" ".join(t.split()[: WIDTH - 4]) for t in texts]

    def padded(batch: dict[str, list[str]]) -> Any:
        return tok(batch["text"], padding="max_length", truncation=True, max_length=WIDTH)

    def unpadded(batch: dict[str, list[str]]) -> Any:
        return tok(batch["text"], truncation=True, max_length=WIDTH)

    raw = Dataset.from_dict({"text": short})
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=WIDTH,
        pad_token_id=tok.pad_token_id,
    )
    return {
        "tokenizer": tok,
        "padded": raw.map(padded, batched=True, remove_columns=["text"]),
        "unpadded": raw.map(unpadded, batched=True, remove_columns=["text"]),
        "model": lambda: LlamaForCausalLM._from_config(config, attn_implementation="eager"),
    }


def _arguments(tmp_path: Path) -> dict[str, Any]:
    """Three optimizer steps of four rows, logged each step, on the CPU: what the snippet's ``...`` stands for."""
    return {
        "output_dir": str(tmp_path),
        "max_steps": 3,
        "per_device_train_batch_size": 4,
        "learning_rate": 3e-4,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
    }


def _written(arguments: dict[str, Any]) -> str:
    """The arguments as a call's keywords, the way a user fills the snippet's ``...``."""
    return "".join(f"{k}={v!r}, " for k, v in arguments.items())


def _run(snippet: str, names: dict[str, Any]) -> dict[str, Any]:
    """Execute ``snippet`` (its ``...`` already filled) with the job's names; returns its namespace."""
    namespace = dict(names)
    exec(compile(snippet, "<snippet>", "exec"), namespace)  # the printed code, as pasted
    return namespace


def _trained(trainer: Any) -> list[float]:
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(losses) == 3 and all(math.isfinite(v) and v > 0 for v in losses), losses
    return losses


def test_the_collator_advised_for_a_causal_lm_dataset_trains(job: dict[str, Any], tmp_path: Path) -> None:
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

    advice = remedy(RemedyId.TRIM_PADDING).advice(
        Framework.HF_TRAINER, {"collate_fn": "default_data_collator"}
    )
    snippet = advice.snippet
    filled = snippet.replace("Trainer(..., ", "Trainer(model=model, args=args, train_dataset=train, ")
    names = {
        "Trainer": Trainer,
        "tokenizer": job["tokenizer"],
        "model": job["model"](),
        "args": TrainingArguments(**_arguments(tmp_path)),
        "train": job["unpadded"],  # "tokenize without padding='max_length'", as the snippet says
    }
    _trained(_run(filled, names)["trainer"])
    # the old advice on the same rows: no labels in a causal-LM dataset, no loss
    old = Trainer(
        model=job["model"](),
        args=names["args"],
        train_dataset=job["unpadded"],
        data_collator=DataCollatorForSeq2Seq(job["tokenizer"], padding="longest"),
    )
    with pytest.raises(ValueError, match="did not return a loss"):
        old.train()


def _same_loss(model: Any, packed_batch: dict[str, Any], plain_batch: dict[str, Any]) -> None:
    """The packed batch's loss is the unpacked one's: same labelled tokens, attention kept per example."""
    import torch

    model.eval()
    with torch.no_grad():
        packed = model(**packed_batch).loss
        plain = model(**plain_batch).loss
    assert torch.allclose(packed, plain, rtol=1e-4, atol=1e-5), (float(packed), float(plain))


def test_the_kept_pack_change_trains_on_the_jobs_rows_and_keeps_each_examples_loss(
    job: dict[str, Any], tmp_path: Path
) -> None:
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    params = {"done": "64 examples packed", "max_len": WIDTH, "labels": "input_ids", "batch_size": 4}
    snippet = kept_change("pack", "hf_trainer", params).snippet
    filled = snippet.replace(
        "TrainingArguments(..., ", f"TrainingArguments({_written(_arguments(tmp_path))}"
    ).replace("Trainer(..., ", "Trainer(model=model, ")
    model = job["model"]()
    names = {
        "Trainer": Trainer,
        "TrainingArguments": TrainingArguments,
        "tokenizer": job["tokenizer"],
        "model": model,
        "train": job["padded"],  # the job's own rows, padded to max_length as it made them
    }
    ns = _run(filled, names)
    packed = ns["packed"]
    assert max(len(r["input_ids"]) for r in packed) <= WIDTH < sum(len(r["input_ids"]) for r in packed)
    assert sum(len(r["seq_lens"]) for r in packed) == len(job["padded"])  # every example, once
    _trained(ns["trainer"])
    # the first packed row's examples, unpacked and padded per batch by the job's collator: the same loss
    row = packed[0]
    starts = [sum(row["seq_lens"][:i]) for i in range(len(row["seq_lens"]))]
    examples = [
        {"input_ids": row["input_ids"][s : s + n]} for s, n in zip(starts, row["seq_lens"], strict=True)
    ]
    plain = DataCollatorForLanguageModeling(job["tokenizer"], mlm=False)(examples)
    _same_loss(model, ns["collator"]([row]), dict(plain))


def test_the_kept_pack_batch_change_trains_and_keeps_each_batchs_loss(
    job: dict[str, Any], tmp_path: Path
) -> None:
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    snippet = kept_change("pack_batch", "hf_trainer", {"attn": "eager", "collate_fn": LM}).snippet
    filled = snippet.replace("Trainer(..., ", "Trainer(model=model, args=args, train_dataset=train, ")
    model = job["model"]()
    names = {
        "Trainer": Trainer,
        "DataCollatorForLanguageModeling": DataCollatorForLanguageModeling,
        "tokenizer": job["tokenizer"],
        "model": model,
        "args": TrainingArguments(**_arguments(tmp_path)),
        "train": job["padded"],
    }
    ns = _run(filled, names)
    _trained(ns["trainer"])
    rows = [job["padded"][i] for i in range(4)]
    plain = DataCollatorForLanguageModeling(job["tokenizer"], mlm=False)(rows)
    packed = ns["collator"](rows)
    assert packed["input_ids"].numel() < plain["input_ids"].numel()  # padding gone
    _same_loss(model, dict(packed), dict(plain))


def test_the_plain_pytorch_padding_snippets_run(job: dict[str, Any]) -> None:
    """A plain loop: the drop-the-argument call where no line is known, the per-batch pad, and the kept pack
    change's loader; each batch goes through the model with a loss."""
    import torch
    from torch.utils.data import DataLoader

    tok = job["tokenizer"]
    texts = _newcomer().corpus(8)
    drop = kept_change("trim_padding", "pytorch", {"padded_by": "tokenizer", "padded_to": WIDTH}).snippet
    call = "\n".join(drop.splitlines()[:2]).replace("tokenizer(texts", "encoded = tokenizer(texts")
    ns = _run(call, {"tokenizer": tok, "texts": texts})
    rows = list(ns["encoded"]["input_ids"])  # the job's rows: token id lists
    assert len({len(r) for r in rows}) > 1  # no longer all max_length
    pad = _run(drop.splitlines()[-1], {"tokenizer": tok, "rows": rows})  # the collate's per-batch pad
    batch = pad["batch"]
    assert batch["input_ids"].shape == (len(rows), max(len(r) for r in rows))
    model = job["model"]()
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    assert torch.isfinite(model(**batch, labels=labels).loss)

    snippet = kept_change(
        "pack", "pytorch", {"max_len": WIDTH, "labels": "input_ids", "batch_size": 4}
    ).snippet
    names = {"DataLoader": DataLoader, "tokenizer": tok, "model": model, "train": job["padded"]}
    loader = _run(snippet, names)["loader"]
    first = next(iter(loader))
    assert first["input_ids"].shape[0] == 4 and first["input_ids"].shape[1] <= WIDTH
    loss = model(**first).loss
    loss.backward()
    assert torch.isfinite(loss)


def test_the_trl_pack_snippet_trains(job: dict[str, Any], tmp_path: Path) -> None:
    from trl import SFTConfig, SFTTrainer

    snippet = kept_change("pack", "trl", {"max_len": WIDTH, "labels": "input_ids"}).snippet
    arguments = {k: v for k, v in _arguments(tmp_path).items() if k != "use_cpu"}
    filled = snippet.replace("SFTConfig(..., ", f"SFTConfig({_written(arguments)}use_cpu=True, ")
    config = _run(filled, {"SFTConfig": SFTConfig})["config"]
    assert config.packing and config.max_length == WIDTH
    trainer = SFTTrainer(
        model=job["model"](), args=config, train_dataset=job["unpadded"], processing_class=job["tokenizer"]
    )
    _trained(trainer)


@pytest.mark.parametrize("framework", [Framework.HF_TRAINER, Framework.TRL])
def test_the_group_by_length_snippet_trains(
    job: dict[str, Any], tmp_path: Path, framework: Framework
) -> None:
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments
    from trl import SFTConfig, SFTTrainer

    snippet = remedy(RemedyId.GROUP_BY_LENGTH).advice(framework, {}).snippet
    config = "SFTConfig" if framework is Framework.TRL else "TrainingArguments"
    filled = snippet.replace(f"{config}(..., ", f"{config}({_written(_arguments(tmp_path))}")
    args = _run(filled, {"TrainingArguments": TrainingArguments, "SFTConfig": SFTConfig})["args"]
    assert args.train_sampling_strategy == "group_by_length"
    model, tok = job["model"](), job["tokenizer"]
    if framework is Framework.TRL:
        _trained(SFTTrainer(model=model, args=args, train_dataset=job["unpadded"], processing_class=tok))
    else:
        collator = DataCollatorForLanguageModeling(tok, mlm=False)
        _trained(Trainer(model=model, args=args, train_dataset=job["unpadded"], data_collator=collator))


def test_the_plain_pytorch_grouping_and_bucket_snippets_run(job: dict[str, Any]) -> None:
    import torch
    from torch.utils.data import DataLoader
    from transformers import DataCollatorForLanguageModeling

    tok = job["tokenizer"]
    collate = DataCollatorForLanguageModeling(tok, mlm=False)
    grouped = remedy(RemedyId.GROUP_BY_LENGTH).advice(Framework.PYTORCH, {"batch_size": 4}).snippet
    names = {"DataLoader": DataLoader, "dataset": job["unpadded"], "collate": collate}
    loader = _run(grouped, names)["loader"]
    batches = list(loader)
    assert sum(b["input_ids"].shape[0] for b in batches) == len(job["unpadded"])
    model = job["model"]()
    assert torch.isfinite(model(**batches[0]).loss)

    bucket = remedy(RemedyId.LENGTH_BUCKETS).advice(Framework.PYTORCH, {}).snippet
    rows = [job["unpadded"][i]["input_ids"] for i in range(4)]
    length = _run(bucket, {"rows": rows})["length"]
    longest = max(len(r) for r in rows)
    assert longest <= length < 1.5 * max(longest, 16) + 1 and length in (16, 24, 32, 48, 64, 96, 128)


@pytest.mark.parametrize("collate_fn", [LM, "DataCollatorForSeq2Seq"])
def test_the_length_buckets_trainer_snippet_trains(
    job: dict[str, Any], tmp_path: Path, collate_fn: str
) -> None:
    """The causal-LM collator for a dataset without labels; DataCollatorForSeq2Seq kept where the job's rows
    carry their labels (it uses it already)."""
    from transformers import Trainer, TrainingArguments

    snippet = (
        remedy(RemedyId.LENGTH_BUCKETS)
        .advice(Framework.HF_TRAINER, {"collate_fn": collate_fn, "multiple": 16})
        .snippet
    )
    filled = snippet.replace("Trainer(..., ", "Trainer(model=model, args=args, train_dataset=train, ")
    train = job["unpadded"]
    if collate_fn != LM:
        train = train.map(lambda r: {"labels": list(r["input_ids"])})
    names = {
        "Trainer": Trainer,
        "tokenizer": job["tokenizer"],
        "model": job["model"](),
        "args": TrainingArguments(**_arguments(tmp_path)),
        "train": train,
    }
    ns = _run(filled, names)
    batch = ns["collator"]([train[i] for i in range(4)])
    assert batch["input_ids"].shape[1] % 16 == 0 and "labels" in batch
    _trained(ns["trainer"])


def test_doctor_on_the_newcomer_job_proposes_dropping_the_argument_at_its_line(tmp_path: Path) -> None:
    from tests.conftest import doctor

    number, line = _padding_line(JOB)
    env = {
        "OMP_NUM_THREADS": "2",
        "TOKENIZERS_PARALLELISM": "false",
    }  # history: conftest gives each test its own
    doc, _ = doctor(tmp_path, sys.executable, str(JOB), "--steps", "200", warmup=2, steps=6, env=env)
    padding = next(f for f in doc["findings"] if f["cause"] == "padding_waste")
    ev = padding["evidence"]
    assert ev["padded_by"] == "tokenizer" and ev["padded_to"] == 256 and ev["fixed_row_length"] is True
    assert ev["site"] == f"{JOB}:{number}" and ev["collate_fn"] == LM
    first = padding["fix"]["remedies"][0]
    assert first["id"] == "trim_padding" and first["params"]["code"] == line
    assert padding["fix"]["text"].startswith(
        f'Drop padding="max_length" from the tokenizer call ({JOB}:{number})'
    )
    snippet = padding["fix"]["snippets"]["hf_trainer"].splitlines()
    assert snippet[1] == line.replace('padding="max_length", ', "")
    assert not any("DataCollatorForSeq2Seq(" in s.split("#")[0] for s in snippet)


def test_tune_on_the_newcomer_job_keeps_the_dropped_argument_as_measured(tmp_path: Path) -> None:
    """The trim_padding trial records the job's padding line; the change tune keeps (and the JSON) is the
    one-line change in the job's code, said to be measured as trim_padding."""
    import json

    from tests.conftest import run_pitstop

    number, line = _padding_line(JOB)
    out = tmp_path / "tune.json"
    command = [sys.executable, str(JOB), "--steps", "100000"]
    proc = run_pitstop(
        *("tune", "--steps", "8", "--warmup", "2", "--budget", "4m", "--only", "trim_padding"),
        *("--json", str(out), "--", *command),
        timeout=900,
        env={"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    trim = next(c for c in doc["candidates"] if c["fix"] == "trim_padding")
    params = trim["applied_params"]
    assert (
        params["padded_by"] == "tokenizer" and params["site"] == f"{JOB}:{number}" and params["code"] == line
    )
    assert params["collate_fn"] == LM and params["measured"] is True
    printed = kept_change("trim_padding", doc["framework"], params)
    assert printed.snippet.splitlines()[1] == line.replace('padding="max_length", ', "")
    if trim["kept"]:  # the verdict is the noise band's (another part of issue 42); the words are these
        change = doc["best"]["changes"][0]
        assert change == {"fix": "trim_padding", "text": printed.text, "snippet": printed.snippet}
        assert "tune measured it as trim_padding" in change["text"]
        assert 'padding="max_length"' not in change["snippet"].splitlines()[1]
