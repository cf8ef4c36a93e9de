"""Demo assets, made once and cached: the instruction pairs (JSONL) and a BPE tokenizer trained on them."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pitstop.atomic import write_atomic
from pitstop.demo.corpus import build_pairs

VOCAB_SIZE = 1024
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")


@dataclass(frozen=True)
class DemoAssets:
    data: Path
    tokenizer: Path


def cache_root() -> Path:
    explicit = os.environ.get("PITSTOP_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pitstop"


def ensure_demo_assets() -> DemoAssets:
    pairs = build_pairs()
    lines = (
        "\n".join(json.dumps({"instruction": p.instruction, "response": p.response}) for p in pairs) + "\n"
    )
    key = hashlib.sha256(f"{VOCAB_SIZE}:{sys.version_info[:2]}:{lines}".encode()).hexdigest()[:16]
    folder = cache_root() / "demo" / key
    folder.mkdir(parents=True, exist_ok=True)
    assets = DemoAssets(data=folder / "pairs.jsonl", tokenizer=folder / "tokenizer.json")
    if not assets.data.exists():
        write_atomic(assets.data, lines)
    if not assets.tokenizer.exists():
        write_atomic(assets.tokenizer, train_tokenizer(p.instruction + "\n" + p.response for p in pairs))
    return assets


def train_tokenizer(texts: Iterable[str]) -> str:
    """A byte-level BPE tokenizer (the GPT-2 recipe) trained on the demo text; returns its JSON."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer.to_str()
