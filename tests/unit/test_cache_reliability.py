"""The token cache under races, kills, changed settings and damage: nothing lost, nothing wrong.

Real processes throughout: concurrent builds of one cache, a build killed (SIGKILL) after every single
filesystem operation it makes and then resumed, ``pitstop data cache`` stopped by SIGINT / SIGTERM / SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pitstop.data import cache as cache_mod
from pitstop.data.cache import build_cache, open_cache
from pitstop.data.errors import DataError
from pitstop.demo.prepare import train_tokenizer

pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[2]


def _rows(n: int) -> str:
    return "".join(
        json.dumps({"instruction": f"Say the number {k} in words.", "output": "It is " + "very " * (k % 7) + f"{k}."})
        + "\n"
        for k in range(n)
    )


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text(_rows(40))
    return path


@pytest.fixture
def tokenizer(tmp_path: Path) -> Path:
    folder = tmp_path / "tok"
    folder.mkdir()
    texts = [f"Say the number {k} in words. It is very {k}. ### Instruction: Response: Below is" for k in range(200)]
    (folder / "tokenizer.json").write_text(train_tokenizer(texts))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "bos_token": "<s>"}))
    return folder


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}


# -- 4. a resume with another shard size ------------------------------------------------------------------


def test_resume_with_another_shard_size_keeps_every_example(data: Path, tokenizer: Path, tmp_path: Path) -> None:
    out = tmp_path / "cache"
    seen: list[int] = []

    def stop_after_two(n: int) -> None:
        seen.append(n)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_cache(data, tokenizer, out, workers=1, shard_size=5, on_progress=stop_after_two)
    path = build_cache(data, tokenizer, out, workers=1, shard_size=7)  # the same cache, another layout
    reference = build_cache(data, tokenizer, tmp_path / "fresh", workers=1, shard_size=7)
    assert len(open_cache(path)) == 40
    assert _files(path) == _files(reference)


# -- 5. every array is checksummed ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mask.bin", "tokens.bin", "offsets.bin"])
def test_one_flipped_byte_in_any_array_is_caught(name: str, data: Path, tokenizer: Path, tmp_path: Path) -> None:
    path = build_cache(data, tokenizer, tmp_path / "cache", workers=1)
    raw = bytearray((path / name).read_bytes())
    raw[len(raw) // 2 + 1] ^= 0x01
    (path / name).write_bytes(bytes(raw))
    with pytest.raises(DataError, match="damaged"):
        open_cache(path)  # loading (stats, pack, datasets) refuses it
    with pytest.raises(DataError, match="damaged"):
        open_cache(path, verify=False).verify()


@pytest.mark.parametrize(
    "change",
    [
        {"examples": "forty"},
        {"tokens": -3},
        {"token_dtype": "float128x"},
        {"layouts": ["alpaca"]},
        {"tokens_sha256": 12},
        {"checksums": {"tokens.bin": 12}},
        None,
    ],
)
def test_a_meta_json_with_wrong_types_is_refused_in_one_line(
    change: dict[str, object] | None, data: Path, tokenizer: Path, tmp_path: Path
) -> None:
    path = build_cache(data, tokenizer, tmp_path / "cache", workers=1)
    meta = json.loads((path / "meta.json").read_text())
    if change is None:
        (path / "meta.json").write_text("{not json")
    else:
        meta.update(change)
        (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="meta.json") as err:
        open_cache(path)
    assert "\n" not in str(err.value)
