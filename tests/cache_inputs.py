"""Inputs for the token-cache tests: numbered instruction rows and a small tokenizer trained on their words."""

from __future__ import annotations

import json
from pathlib import Path

from pitstop.demo.prepare import train_tokenizer


def number_rows(n: int) -> str:
    """``n`` JSONL rows of varied length (0 to 6 extra words)."""
    return "".join(
        json.dumps(
            {"instruction": f"Say the number {k} in words.", "output": "It is " + "very " * (k % 7) + f"{k}."}
        )
        + "\n"
        for k in range(n)
    )


def number_tokenizer(folder: Path, chat_template: str | None = None) -> Path:
    """A tokenizer.json and tokenizer_config.json in ``folder``, trained on the rows' words."""
    folder.mkdir()
    texts = [
        f"Say the number {k} in words. It is very {k}. ### Instruction: Response: Below is"
        for k in range(200)
    ]
    (folder / "tokenizer.json").write_text(train_tokenizer(texts))
    config = {"eos_token": "</s>", "bos_token": "<s>"}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder
