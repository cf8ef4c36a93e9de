"""Offline stand-ins for what the public scripts fetch from the Hub: a tiny random causal LM saved to a
local folder, the GPT-2 tokenizer wrapped as a local tokenizer folder, and local text from ../shared/data.

Everything is built from a config with a fixed seed, so two runs of a script see the same weights."""

from __future__ import annotations

import json
from pathlib import Path

VOCAB_SPECIAL = "<|endoftext|>"


def tokenizer_folder(shared: Path, where: Path) -> Path:
    """The GPT-2 fast-tokenizer file as a folder ``AutoTokenizer.from_pretrained`` reads."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(shared / "tokenizers" / "gpt2_tokenizer.json"),
        bos_token=VOCAB_SPECIAL,
        eos_token=VOCAB_SPECIAL,
        unk_token=VOCAB_SPECIAL,
        model_max_length=1024,
    )
    tok.save_pretrained(where)
    return where


def tiny_llama(where: Path, vocab_size: int, attn: str = "sdpa") -> Path:
    """A 2-layer Llama with random weights (seed 0), saved with its config: 'a model on the Hub'."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        attn_implementation=attn,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(where)
    return where


def model_folder(shared: Path, where: Path) -> Path:
    """Tokenizer and tiny model in one folder, as a Hub checkpoint would be."""
    tokenizer_folder(shared, where)
    tiny_llama(where, vocab_size=50257)
    return where


def gsm8k_texts(shared: Path, count: int) -> list[str]:
    rows = (shared / "datasets" / "gsm8k_train.jsonl").read_text().splitlines()[:count]
    return [json.loads(row)["question"] for row in rows]


def text_file(shared: Path, where: Path, count: int) -> Path:
    """Plain text, one GSM8K question a line: the ``--train_file x.txt`` of run_clm."""
    where.write_text("\n".join(gsm8k_texts(shared, count)) + "\n")
    return where


def alpaca_messages(shared: Path, where: Path, count: int) -> Path:
    """Alpaca records as a local conversational JSON-lines dataset (TRL's ``messages`` format)."""
    records = json.loads((shared / "datasets" / "alpaca_en_demo.json").read_text())[:count]
    lines = []
    for rec in records:
        prompt = rec["instruction"] + ("\n\n" + rec["input"] if rec["input"] else "")
        lines.append(json.dumps({"prompt": prompt, "completion": rec["output"]}))
    where.write_text("\n".join(lines) + "\n")
    return where


def hub_shaped(shared: Path, work: Path, non_empty: int, model: Path) -> None:
    """The accelerate example hard-codes ``HuggingFaceTB/SmolLM-360M`` and ``Salesforce/wikitext``. Both
    names are looked up as local folders first (``os.path.isdir``), so folders of those names in the
    script's working folder stand in for the Hub, with no edit and no patch: the tiny model with the GPT-2
    tokenizer, and a wikitext-shaped dataset whose ``wikitext-2-v1`` config has 500 training rows (the
    script selects 500) of which ``non_empty`` hold text (the script drops the empty ones, as wikitext has
    many), so an epoch is short. ``model``: a ``model_folder`` already built, linked in under the Hub's name."""
    (work / "HuggingFaceTB").mkdir(parents=True, exist_ok=True)
    (work / "HuggingFaceTB" / "SmolLM-360M").symlink_to(model, target_is_directory=True)
    data = work / "Salesforce" / "wikitext"
    (data / "wikitext-2-v1").mkdir(parents=True, exist_ok=True)
    texts = gsm8k_texts(shared, non_empty + 2)
    train = texts[:non_empty] + [""] * (500 - non_empty)
    for split, rows in (("train", train), ("validation", texts[non_empty:])):
        lines = [json.dumps({"text": text}) for text in rows]
        (data / "wikitext-2-v1" / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    (data / "README.md").write_text(
        "---\nconfigs:\n- config_name: wikitext-2-v1\n  data_files:\n"
        "  - split: train\n    path: wikitext-2-v1/train.jsonl\n"
        "  - split: validation\n    path: wikitext-2-v1/validation.jsonl\n---\n"
    )


def wikitext_file(shared: Path, work: Path, count: int) -> Path:
    """Lightning's WikiText2 demo reads ``./data/wikitext-2.txt`` and downloads it only when it is absent:
    local text there keeps it offline."""
    where = work / "data" / "wikitext-2.txt"
    where.parent.mkdir(parents=True, exist_ok=True)
    return text_file(shared, where, count)
