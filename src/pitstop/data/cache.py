"""A content-addressed cache of tokenized examples: tokenize once, read zero-copy forever.

Layout of ``<out>/<key>/``: ``tokens.bin`` (every example's token ids back to back, uint16 when the
vocabulary allows, else uint32), ``offsets.bin`` (int64, n+1 boundaries), ``mask.bin`` (uint8 loss mask
beside the tokens: 1 = trained on) and ``meta.json``. The key hashes what the tokens depend on: the data
file's bytes, the tokenizer (its JSON and config), the template and the settings, so a cache made with
another tokenizer is never reused.

Building: examples are read in order and cut into shards; worker processes tokenize shards with batched
fast-tokenizer calls; each finished shard is written with a ``.done`` marker inside ``<key>.partial/``, so
a killed build resumes where it stopped. The final files are assembled there, ``meta.json`` is written
last, and the folder is renamed into place in one step: a half-written cache is never opened as complete.
Opening checks the sizes, the offsets and their CRC against ``meta.json``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from pitstop.data.errors import DataError
from pitstop.data.examples import Example, ReadReport, read_examples
from pitstop.data.tokenize import Renderer, TokenizerInfo, describe_tokenizer, encode_arrays, load_tokenizer

CACHE_FORMAT = 1
SHARD_SIZE = 20_000


@dataclass
class CacheMeta:
    format: int
    key: str
    examples: int
    tokens: int
    trained_tokens: int
    token_dtype: str
    source: str
    tokenizer: str
    tokenizer_fingerprint: str
    template: str
    skipped: int
    layouts: dict[str, int]
    offsets_crc32: int
    tokens_sha256: str


def _hash_source(path: Path) -> str:
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        with file.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def cache_key(source: Path, info: TokenizerInfo, template: str, skip_bad: bool) -> str:
    parts = {
        "format": CACHE_FORMAT,
        "data": _hash_source(source),
        "tokenizer": info.fingerprint,
        "template": template,
        "skip_bad": skip_bad,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


# -- workers ---------------------------------------------------------------------------------------------
_worker: dict[str, Any] = {}


def _init_worker(info: TokenizerInfo, template: str, processes: int) -> None:
    if processes > 1:  # parallel across processes: keep each tokenizer to one thread, not workers × cores
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker["tokenizer"] = load_tokenizer(info)
    _worker["renderer"] = Renderer(template, info)


def _tokenize_shard(task: tuple[int, list[Example]]) -> tuple[int, Any, Any, Any]:
    index, examples = task
    renderer: Renderer = _worker["renderer"]
    tokens, lengths, mask = encode_arrays(_worker["tokenizer"], [renderer.segments(e) for e in examples])
    return index, tokens, lengths, mask


def _shards(examples: Iterator[Example], size: int) -> Iterator[tuple[int, list[Example]]]:
    batch: list[Example] = []
    index = 0
    for example in examples:
        batch.append(example)
        if len(batch) == size:
            yield index, batch
            index, batch = index + 1, []
    if batch:
        yield index, batch


def _write(path: Path, data: bytes | Any) -> None:
    with path.open("wb") as f:
        f.write(data if isinstance(data, bytes) else data.tobytes())
        f.flush()
        os.fsync(f.fileno())


def _disk_full(exc: OSError, where: Path) -> DataError:
    if exc.errno == errno.ENOSPC:
        return DataError(
            f"disk full while writing the cache in {where}; finished shards are kept there and a "
            "rerun resumes after space is freed"
        )
    return DataError(f"cannot write the cache in {where}: {exc.strerror or exc}")


def build_cache(
    data: str | Path,
    tokenizer: str | Path,
    out: str | Path,
    template: str = "auto",
    workers: int | None = None,
    skip_bad: bool = False,
    shard_size: int = SHARD_SIZE,
    on_progress: Callable[[int], None] | None = None,
) -> Path:
    """Tokenize ``data`` into ``out/<key>/`` (or reuse it when it exists) and return that folder."""
    source = Path(data)
    if not source.exists():
        raise DataError(f"{source}: no such file or folder")
    info = describe_tokenizer(tokenizer)
    load_tokenizer(info)  # fail here, in one line, rather than in every worker
    key = cache_key(source, info, template, skip_bad)
    root = Path(out)
    final = root / key
    if (final / "meta.json").is_file():
        open_cache(final)  # integrity-checked reuse
        return final
    partial = root / f"{key}.partial"
    try:
        partial.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _disk_full(exc, root) from None
    report = ReadReport()
    examples = read_examples(source, skip_bad=skip_bad, report=report)
    todo = (
        task for task in _shards(examples, shard_size) if not (partial / f"shard-{task[0]:06d}.done").exists()
    )
    workers = max(1, workers if workers is not None else min(8, (os.cpu_count() or 2)))
    ctx = get_context("fork") if hasattr(os, "fork") else get_context("spawn")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(info, template, workers)) as pool:
        for index, tokens, lengths, mask in pool.imap(_tokenize_shard, todo):
            stem = partial / f"shard-{index:06d}"
            try:
                _write(stem.with_suffix(".tokens"), tokens)
                _write(stem.with_suffix(".lengths"), lengths)
                _write(stem.with_suffix(".mask"), mask)
                _write(stem.with_suffix(".done"), b"")
            except OSError as exc:
                for suffix in (".tokens", ".lengths", ".mask"):
                    stem.with_suffix(suffix).unlink(missing_ok=True)
                raise _disk_full(exc, partial) from None
            if on_progress is not None:
                on_progress(len(lengths))
    if report.examples == 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise DataError(
            f"{source}: no usable examples" + (f" ({report.first_error})" if report.first_error else "")
        )
    try:
        _assemble(partial, final, key, source, info, template, report)
    except OSError as exc:
        for name in ("tokens.bin", "offsets.bin", "mask.bin", "meta.json"):
            (partial / name).unlink(missing_ok=True)
        raise _disk_full(exc, partial) from None
    return final


def _assemble(
    partial: Path, final: Path, key: str, source: Path, info: TokenizerInfo, template: str, report: ReadReport
) -> None:
    shards = sorted(partial.glob("shard-*.done"))
    lengths = np.concatenate([np.fromfile(s.with_suffix(".lengths"), dtype=np.int64) for s in shards])
    max_id = 0
    for s in shards:
        t = np.fromfile(s.with_suffix(".tokens"), dtype=np.uint32)
        if t.size:
            max_id = max(max_id, int(t.max()))
    dtype = np.uint16 if max_id < 2**16 else np.uint32
    digest = hashlib.sha256()
    trained = 0
    with (partial / "tokens.bin").open("wb") as tokens_out, (partial / "mask.bin").open("wb") as mask_out:
        for s in shards:
            block = np.fromfile(s.with_suffix(".tokens"), dtype=np.uint32).astype(dtype).tobytes()
            digest.update(block)
            tokens_out.write(block)
            mask = np.fromfile(s.with_suffix(".mask"), dtype=np.uint8)
            trained += int(mask.sum())
            mask_out.write(mask.tobytes())
        for f in (tokens_out, mask_out):
            f.flush()
            os.fsync(f.fileno())
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    _write(partial / "offsets.bin", offsets)
    meta = CacheMeta(
        format=CACHE_FORMAT,
        key=key,
        examples=int(lengths.size),
        tokens=int(offsets[-1]),
        trained_tokens=trained,
        token_dtype=np.dtype(dtype).name,
        source=str(source),
        tokenizer=str(info.path),
        tokenizer_fingerprint=info.fingerprint,
        template=template,
        skipped=report.skipped,
        layouts=dict(report.layouts or {}),
        offsets_crc32=zlib.crc32(offsets.tobytes()),
        tokens_sha256=digest.hexdigest(),
    )
    for s in shards:
        for suffix in (".tokens", ".lengths", ".mask", ".done"):
            s.with_suffix(suffix).unlink(missing_ok=True)
    _write(partial / "meta.json", json.dumps(asdict(meta), indent=1).encode())
    try:
        os.rename(partial, final)  # the only step that makes a cache visible: atomic on one filesystem
    except OSError:
        if not (final / "meta.json").is_file():
            raise
        shutil.rmtree(partial, ignore_errors=True)  # another process finished the same cache first


class TokenCache:
    """A built cache, memory-mapped: example ``i`` is a view, never a copy."""

    def __init__(self, path: Path, meta: CacheMeta) -> None:
        self.path = path
        self.meta = meta
        self.tokens = np.memmap(path / "tokens.bin", dtype=meta.token_dtype, mode="r", shape=(meta.tokens,))
        self.mask = np.memmap(path / "mask.bin", dtype=np.uint8, mode="r", shape=(meta.tokens,))
        self.offsets = np.fromfile(path / "offsets.bin", dtype=np.int64)

    def __len__(self) -> int:
        return self.meta.examples

    @property
    def lengths(self) -> Any:
        return np.diff(self.offsets)

    def example(self, i: int) -> tuple[Any, Any]:
        lo, hi = self.offsets[i], self.offsets[i + 1]
        return self.tokens[lo:hi], self.mask[lo:hi]

    def verify(self) -> None:
        """Full check: the tokens' SHA-256 (reads every byte; opening only checks sizes and offsets)."""
        if hashlib.sha256(np.asarray(self.tokens).tobytes()).hexdigest() != self.meta.tokens_sha256:
            raise DataError(f"{self.path}: token checksum mismatch (the cache was modified or damaged)")


def open_cache(path: str | Path) -> TokenCache:
    """Open ``path`` (a cache folder, or a folder holding exactly one) after checking its integrity."""
    folder = Path(path)
    if not (folder / "meta.json").is_file():
        inside = [p for p in folder.iterdir() if (p / "meta.json").is_file()] if folder.is_dir() else []
        if len(inside) == 1:
            folder = inside[0]
        elif len(inside) > 1:
            names = ", ".join(sorted(p.name for p in inside))
            raise DataError(f"{path}: holds several caches ({names}); name one")
        else:
            partial = list(folder.glob("*.partial")) if folder.is_dir() else []
            extra = (
                " (an unfinished build is there: run `pitstop data cache` again to resume it)"
                if partial
                else ""
            )
            raise DataError(f"{path}: no complete pitstop cache{extra}")
    try:
        raw = json.loads((folder / "meta.json").read_text())
        meta = CacheMeta(**raw)
    except (ValueError, TypeError) as exc:
        raise DataError(f"{folder}: unreadable meta.json ({exc})") from None
    if meta.format != CACHE_FORMAT:
        raise DataError(
            f"{folder}: cache format {meta.format}, this pitstop reads {CACHE_FORMAT}; rebuild it"
        )
    width = np.dtype(meta.token_dtype).itemsize
    expected = {
        "tokens.bin": meta.tokens * width,
        "mask.bin": meta.tokens,
        "offsets.bin": (meta.examples + 1) * 8,
    }
    for name, size in expected.items():
        actual = (folder / name).stat().st_size if (folder / name).is_file() else -1
        if actual != size:
            raise DataError(f"{folder}: {name} is {actual} bytes, meta.json says {size}: a damaged cache")
    offsets = np.fromfile(folder / "offsets.bin", dtype=np.int64)
    if zlib.crc32(offsets.tobytes()) != meta.offsets_crc32 or offsets[0] != 0 or offsets[-1] != meta.tokens:
        raise DataError(f"{folder}: offsets do not match meta.json: a damaged cache")
    return TokenCache(folder, meta)
