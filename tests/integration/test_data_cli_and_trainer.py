"""`pitstop data` end to end, and a real Trainer run on a packed cache in three lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pitstop.demo.prepare import train_tokenizer
from tests.conftest import run_pitstop

pytestmark = pytest.mark.slow


def test_stats_cache_and_pack_on_real_data(shared_data: Path, tmp_path: Path) -> None:
    data = shared_data / "datasets" / "gsm8k_train.jsonl"
    tok = shared_data / "tokenizers" / "gpt2_tokenizer.json"
    proc = run_pitstop(
        "data",
        "cache",
        str(data),
        "--tokenizer",
        str(tok),
        "--out",
        str(tmp_path / "cache"),
        "--template",
        "alpaca",
        "--verify",
    )
    assert proc.returncode == 0, proc.stderr
    assert "7,473 examples" in proc.stdout
    stats_json = tmp_path / "stats.json"
    proc = run_pitstop(
        "data",
        "stats",
        str(tmp_path / "cache"),
        "--max-len",
        "1024",
        "--batch-size",
        "8",
        "--json",
        str(stats_json),
    )
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(stats_json.read_text())
    assert stats["examples"] == 7473 and stats["min"] > 0 and stats["max"] <= 1024
    assert stats["padding_now"] > 0.2  # random batches of 8 padded to their longest
    assert stats["padding_packed"] < 0.05 and stats["padding_grouped"] < stats["padding_now"]
    pack_json = tmp_path / "pack.json"
    proc = run_pitstop("data", "pack", str(tmp_path / "cache"), "--max-len", "1024", "--json", str(pack_json))
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(pack_json.read_text())
    assert {"bins", "efficiency", "lower_bound", "seconds"} <= set(plan)
    assert sorted(i for row in plan["bins"] for i in row) == list(range(7473))
    assert plan["rows"] >= plan["lower_bound"] and plan["efficiency"] > 0.95


@pytest.mark.smoke
def test_pack_a_lengths_file(tmp_path: Path) -> None:
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(n) for n in [100, 900, 50, 2000, 300] * 20))
    out = tmp_path / "p.json"
    proc = run_pitstop("data", "pack", str(lengths), "--max-len", "1024", "--split", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(out.read_text())
    assert plan["too_long"] == 20 and plan["overflow"] == "split" and plan["dropped_tokens"] == 0


def test_bad_data_gets_a_line_number_or_is_skipped(tmp_path: Path) -> None:
    tok = tmp_path / "tok.json"
    tok.write_text(train_tokenizer(["hello world answer question"] * 50))
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello"}\n{oops\n{"text": "world"}\n')
    proc = run_pitstop("data", "cache", str(data), "--tokenizer", str(tok), "--out", str(tmp_path / "c"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pitstop: {data}:2: not valid JSON")
    assert lines[0].endswith("(use --skip-bad to skip and count such examples)")
    proc = run_pitstop(
        "data", "cache", str(data), "--tokenizer", str(tok), "--out", str(tmp_path / "c"), "--skip-bad"
    )
    assert proc.returncode == 0 and "2 examples" in proc.stdout and "1 examples skipped" in proc.stdout
    proc = run_pitstop("data", "cache", str(data), "--tokenizer", str(tmp_path / "missing.json"))
    assert proc.returncode == 2 and "no tokenizer.json" in proc.stderr


def test_jsonl_to_a_packed_cached_trainer_run(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    rows = [
        {"instruction": f"Count to {k}.", "output": " ".join(str(i) for i in range(k % 30 + 1))}
        for k in range(300)
    ]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text(train_tokenizer([json.dumps(r) for r in rows]))
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=4096,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            use_cache=False,
        )
    )
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        max_steps=6,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
    )

    from pitstop.data import PackedDataset, PackingCollator, build_cache

    # the three lines a user writes
    cache = build_cache(data, tmp_path / "tok", out=tmp_path / "cache", template="alpaca")
    train = PackedDataset(cache, max_len=1024)
    trainer = transformers.Trainer(
        model, args, train_dataset=train, data_collator=PackingCollator(model.config._attn_implementation)
    )

    result = trainer.train()
    assert result.global_step == 6 and torch.isfinite(torch.tensor(result.training_loss))
    assert len(train) < len(rows) / 3  # whole examples share rows


def test_bad_data_stops_the_workers_without_a_traceback(tmp_path: Path) -> None:
    """The bad line is found while the tokenizing processes still start: stopping them then must not run the
    CLI's SIGTERM handler inherited across the fork (it printed a traceback in about 1 run of 3)."""
    tok = tmp_path / "tok.json"
    tok.write_text(train_tokenizer(["hello world answer question"] * 50))
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello"}\n{oops\n{"text": "world"}\n')
    for i in range(8):
        proc = run_pitstop(
            "data", "cache", str(data), "--tokenizer", str(tok), "--out", str(tmp_path / f"c{i}")
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
