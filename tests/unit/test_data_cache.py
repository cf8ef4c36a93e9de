"""The token cache: content keys, zero-copy reads, resume after a kill, atomic completion, integrity, full disk."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest
from tests.cache_inputs import number_rows, number_tokenizer

from pitstop.data import fsops
from pitstop.data.cache import build_cache, open_cache
from pitstop.data.errors import DataError
from pitstop.demo.prepare import train_tokenizer

pytest.importorskip("tokenizers")

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text(number_rows(40))
    return path


@pytest.fixture
def tokenizer(tmp_path: Path) -> Path:
    return number_tokenizer(tmp_path / "tok", CHAT_TEMPLATE)


@pytest.mark.slow
def test_build_open_and_masks(data: Path, tokenizer: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    path = build_cache(data, tokenizer, tmp_path / "cache", template="alpaca", workers=2, shard_size=7)
    cache = open_cache(tmp_path / "cache")  # the parent folder holding one cache also opens
    assert cache.path == path and len(cache) == 40 and cache.meta.token_dtype == "uint16"
    ids, mask = cache.example(3)
    assert isinstance(ids, np.memmap)  # a view into the mapped file, not a copy
    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    trained = tok.decode([int(i) for i, m in zip(ids, mask, strict=True) if m])
    assert trained.startswith("It is very very very 3.") and "Instruction" not in trained
    assert cache.meta.trained_tokens == int(np.asarray(cache.mask).sum())
    cache.verify()


@pytest.mark.slow
def test_chat_template_trains_only_assistant_turns(tmp_path: Path, tokenizer: Path) -> None:
    from tokenizers import Tokenizer

    data = tmp_path / "chat.jsonl"
    data.write_text(
        json.dumps(
            {"messages": [{"role": "user", "content": "Say 5"}, {"role": "assistant", "content": "It is 5."}]}
        )
        + "\n"
    )
    cache = open_cache(build_cache(data, tokenizer, tmp_path / "c", template="tokenizer", workers=1))
    ids, mask = cache.example(0)
    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    everything = tok.decode([int(i) for i in ids], skip_special_tokens=False)
    trained = tok.decode([int(i) for i, m in zip(ids, mask, strict=True) if m], skip_special_tokens=False)
    assert everything.replace(" ", "").startswith("<s>user")
    assert trained.replace(" ", "").strip() == "Itis5.</s>"  # the assistant header is prompt, not trained on


@pytest.mark.slow
def test_reused_when_unchanged_and_keyed_by_tokenizer(data: Path, tokenizer: Path, tmp_path: Path) -> None:
    first = build_cache(data, tokenizer, tmp_path / "cache", workers=1)
    stamp = (first / "tokens.bin").stat().st_mtime_ns
    again = build_cache(data, tokenizer, tmp_path / "cache", workers=1)
    assert again == first and (first / "tokens.bin").stat().st_mtime_ns == stamp
    other = tmp_path / "other_tok"
    other.mkdir()
    (other / "tokenizer.json").write_text(train_tokenizer(["completely different text " * 20] * 20))
    third = build_cache(data, other, tmp_path / "cache", workers=1)
    assert third != first  # another tokenizer never reuses the cache


@pytest.mark.slow
def test_resumes_after_a_kill_and_is_never_half_open(data: Path, tokenizer: Path, tmp_path: Path) -> None:
    out = tmp_path / "cache"
    seen: list[int] = []

    def killed_after_two(n: int) -> None:
        seen.append(n)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_cache(data, tokenizer, out, workers=1, shard_size=5, on_progress=killed_after_two)
    partial = next(out.glob("*.partial"))
    assert len(list(partial.glob("shard-*.bin"))) == 2
    with pytest.raises(DataError, match="unfinished build"):
        open_cache(out)
    resumed: list[int] = []
    path = build_cache(data, tokenizer, out, workers=1, shard_size=5, on_progress=resumed.append)
    assert sum(resumed) == 40 - 10  # only the shards not done before
    fresh = build_cache(data, tokenizer, tmp_path / "fresh", workers=2, shard_size=5)
    a, b = open_cache(path), open_cache(fresh)
    assert np.array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    assert np.array_equal(a.offsets, b.offsets) and not partial.exists()


@pytest.mark.slow
def test_damage_is_detected(data: Path, tokenizer: Path, tmp_path: Path) -> None:
    path = build_cache(data, tokenizer, tmp_path / "cache", workers=1)
    raw = bytearray((path / "tokens.bin").read_bytes())
    raw[10] ^= 0xFF
    (path / "tokens.bin").write_bytes(bytes(raw))
    with pytest.raises(DataError, match="checksum"):
        open_cache(path).verify()
    (path / "tokens.bin").write_bytes(bytes(raw[:-2]))
    with pytest.raises(DataError, match="damaged"):
        open_cache(path)


@pytest.mark.slow
def test_full_disk_fails_cleanly(
    data: Path, tokenizer: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    real_write = fsops.write_file

    def filling_up(path: Path, *payload: bytes) -> None:
        calls["n"] += 1
        if calls["n"] > 2:  # build.json, the first shard; the second shard runs out of space
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, *payload)

    monkeypatch.setattr(fsops, "write_file", filling_up)
    with pytest.raises(DataError, match="disk full"):
        build_cache(data, tokenizer, tmp_path / "cache", workers=1, shard_size=10)
    partial = next((tmp_path / "cache").glob("*.partial"))
    assert not list((tmp_path / "cache").glob("*/meta.json"))  # nothing looks complete
    assert [p.name for p in partial.glob("shard-*")] == ["shard-000000.bin"]  # no half-written shard
    monkeypatch.undo()  # space is freed: the rerun resumes
    path = build_cache(data, tokenizer, tmp_path / "cache", workers=1, shard_size=10)
    assert len(open_cache(path)) == 40


def test_bad_tokenizer_and_bad_data(tmp_path: Path, data: Path) -> None:
    junk = tmp_path / "junk.json"
    junk.write_text("{}")
    with pytest.raises(DataError, match="cannot load"):
        build_cache(data, junk, tmp_path / "c")
    with pytest.raises(DataError, match=r"no tokenizer\.json"):
        build_cache(data, tmp_path / "nowhere", tmp_path / "c")
