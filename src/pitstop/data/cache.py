"""A content-addressed cache of tokenized examples: tokenize once, read zero-copy forever.

Layout of ``<out>/<key>/``: ``tokens.bin`` (every example's token ids back to back, uint16 when the
vocabulary allows, else uint32), ``offsets.bin`` (int64, n+1 boundaries), ``mask.bin`` (uint8 loss mask
beside the tokens: 1 = trained on) and ``meta.json`` (counts, and a CRC-32 and SHA-256 of each array). The
key hashes what the tokens depend on: the data file's bytes, the tokenizer (its JSON and config), the
template and the settings, so a cache made with another tokenizer is never reused.

Building, safe against races and kills at any instant:

* one builder per key: ``<key>.lock`` (see ``lock.py``); a second build of the same cache waits, then
  reuses what the first one made;
* examples are read in order and cut into shards; worker processes tokenize them with batched
  fast-tokenizer calls; a finished shard is one file, written under a private name and renamed into
  ``<key>.partial/``, so a shard on disk is always whole. ``build.json`` there names the layout (the format
  and the shard size): a resume with other settings starts over instead of mixing shards;
* assembly writes the final files into ``<key>.partial/assembled/`` from the shards (which it never
  changes), checks the example count against the source, and publishes the folder by one rename to
  ``<key>/``; only then is the partial build removed. A kill at any point leaves either the shards (the next
  run assembles again) or the published cache (the next run finishes the cleanup).

Opening checks the sizes, the offsets and every array's CRC-32 against ``meta.json`` (``verify=False``
skips the CRCs); ``TokenCache.verify()`` checks every array's SHA-256.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from pitstop.data import fsops
from pitstop.data.errors import BuildInterrupted, DataError
from pitstop.data.examples import Example, ReadReport, read_examples
from pitstop.data.lock import BuildLock
from pitstop.data.regular import check_regular, regular_problem
from pitstop.data.tokenize import Renderer, TokenizerInfo, describe_tokenizer, encode_arrays, load_tokenizer

CACHE_FORMAT = 2
SHARD_SIZE = 20_000
ARRAYS = ("tokens.bin", "mask.bin", "offsets.bin")
_SHARD = struct.Struct("<4sIQI")  # magic, examples, tokens, CRC-32 of what follows
_SHARD_MAGIC = b"PSH2"
_BLOCK = 1 << 23


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
    checksums: dict[str, dict[str, Any]]  # array file -> {"crc32": int, "sha256": hex}


def _meta_problem(raw: Any) -> str | None:
    """What is wrong with a parsed ``meta.json`` (types, ranges), or ``None``: it is read from disk."""
    if not isinstance(raw, dict):
        return "not a JSON object"
    names = [f.name for f in fields(CacheMeta)]
    missing = [n for n in names if n not in raw]
    if missing:
        return f"missing {', '.join(missing)}"
    unknown = sorted(set(raw) - set(names))
    if unknown:
        return f"unknown {', '.join(map(str, unknown))}"
    for name in ("format", "examples", "tokens", "trained_tokens", "skipped"):
        value = raw[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"{name} is {value!r}, not a count"
    for name in ("key", "source", "tokenizer", "tokenizer_fingerprint", "template"):
        if not isinstance(raw[name], str):
            return f"{name} is {raw[name]!r}, not text"
    if raw["token_dtype"] not in ("uint16", "uint32"):
        return f"token_dtype is {raw['token_dtype']!r}, not uint16 or uint32"
    layouts = raw["layouts"]
    if not isinstance(layouts, dict) or not all(isinstance(v, int) for v in layouts.values()):
        return f"layouts is {layouts!r}, not counts by layout"
    sums = raw["checksums"]
    for array in ARRAYS:
        entry = sums.get(array) if isinstance(sums, dict) else None
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("crc32"), int)
            and isinstance(entry.get("sha256"), str)
            and len(entry["sha256"]) == 64
        ):
            return f"no valid checksum for {array}"
    return None


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
_STARTUP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def _die_with(parent: int) -> None:
    """End this worker when the parent ends, however it ends (SIGKILL included): never run on orphaned."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        else:
            if os.getppid() != parent:  # the parent died before the line above
                os._exit(1)
            return

    def watch() -> None:  # elsewhere: look for the parent twice a second
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _init_worker(info: TokenizerInfo, template: str, processes: int, parent: int) -> None:
    # Ctrl-C reaches the whole process group: the parent alone answers it (and ends the pool). A SIGTERM
    # from the parent's pool.terminate() ends a worker quietly, whatever handler the parent had.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):  # blocked by the parent across the fork (see _Workers)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STARTUP_SIGNALS)
    _die_with(parent)
    if processes > 1:  # parallel across processes: keep each tokenizer to one thread, not workers × cores
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker["tokenizer"] = load_tokenizer(info)
    _worker["renderer"] = Renderer(template, info)


def _tokenize_shard(task: tuple[int, list[Example]]) -> tuple[int, Any, Any, Any]:
    index, examples = task
    renderer: Renderer = _worker["renderer"]
    tokens, lengths, mask = encode_arrays(_worker["tokenizer"], [renderer.segments(e) for e in examples])
    return index, tokens, lengths, mask


def _serve(conn: Any, info: TokenizerInfo, template: str, processes: int, parent: int) -> None:
    """A worker: answer each shard sent on ``conn`` with its arrays (or the error), until told to stop."""
    failed: BaseException | None = None
    try:
        _init_worker(info, template, processes, parent)
    except Exception as exc:
        failed = exc
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        try:
            if failed is not None:
                raise failed
            answer: tuple[str, Any] = ("ok", _tokenize_shard(task))
        except Exception as exc:
            answer = ("error", exc if isinstance(exc, DataError) else DataError(f"tokenizing failed: {exc}"))
        try:
            conn.send(answer)
        except (BrokenPipeError, OSError):
            return


class _Workers:
    """Tokenizer processes fed one shard at a time from this thread.

    Not ``multiprocessing.Pool``: its task thread can block forever writing a large shard to workers that
    were terminated, so a Ctrl-C or SIGTERM would hang the build. Here nothing but this thread talks to the
    workers, and ending them is a SIGTERM each.
    """

    def __init__(self, processes: int, info: TokenizerInfo, template: str) -> None:
        ctx = get_context("fork") if hasattr(os, "fork") else get_context("spawn")
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        # A worker inherits the parent's handlers until it sets its own: a SIGTERM from close() in that
        # moment ran the CLI's handler in the child and printed a traceback. Blocked across the fork, such a
        # signal waits in the child until its own handlers are set; the parent's waits the few microseconds.
        masked = hasattr(signal, "pthread_sigmask")
        before = signal.pthread_sigmask(signal.SIG_BLOCK, _STARTUP_SIGNALS) if masked else None
        try:
            for _ in range(processes):
                mine, theirs = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=_serve, args=(theirs, info, template, processes, os.getpid()), daemon=True
                )
                proc.start()
                theirs.close()
                self._procs.append(proc)
                self._conns.append(mine)
        finally:
            if before is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, before)

    def map(self, tasks: Iterator[tuple[int, list[Example]]]) -> Iterator[tuple[int, Any, Any, Any]]:
        """Each task's answer, in the order they finish."""
        from multiprocessing.connection import wait

        idle: list[Any] = list(self._conns)
        busy: set[Any] = set()
        more = True
        while True:
            while idle and more:
                task = next(tasks, None)
                if task is None:
                    more = False
                    break
                conn = idle.pop()
                conn.send(task)
                busy.add(conn)
            if not busy:
                return
            ready: list[Any] = wait(list(busy))
            for conn in ready:
                try:
                    kind, value = conn.recv()
                except (EOFError, OSError):
                    codes = [p.exitcode for p in self._procs if p.exitcode is not None]
                    raise DataError(
                        f"a tokenizing process died (exit code {codes[0] if codes else '?'})"
                    ) from None
                busy.discard(conn)
                idle.append(conn)
                if kind == "error":
                    raise value
                yield value

    def close(self) -> None:
        for conn in self._conns:
            conn.close()  # an idle worker reads EOF and leaves
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()  # a busy one is stopped: SIGTERM, quiet (see _init_worker)
        for proc in self._procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()

    def __enter__(self) -> _Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


# -- shards ------------------------------------------------------------------------------------------------


def _shard_path(partial: Path, index: int) -> Path:
    return partial / f"shard-{index:06d}.bin"


def _shard_head(path: Path) -> tuple[int, int, int] | None:
    """``(examples, tokens, crc)`` of a whole shard file, or ``None`` when it is missing or not whole (a
    FIFO or device in its place is not whole: it is never opened, and the shard is made again)."""
    if regular_problem(path) is not None:
        return None
    try:
        with path.open("rb") as f:
            head = f.read(_SHARD.size)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return None
    if len(head) != _SHARD.size:
        return None
    magic, examples, tokens, crc = _SHARD.unpack(head)
    if magic != _SHARD_MAGIC or size != _SHARD.size + 8 * examples + 5 * tokens:
        return None
    return examples, tokens, crc


def _write_shard(partial: Path, index: int, tokens: Any, lengths: Any, mask: Any) -> None:
    parts = [
        np.ascontiguousarray(lengths, dtype=np.int64).tobytes(),
        np.ascontiguousarray(tokens, dtype=np.uint32).tobytes(),
        np.ascontiguousarray(mask, dtype=np.uint8).tobytes(),
    ]
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    head = _SHARD.pack(_SHARD_MAGIC, len(lengths), len(tokens), crc)
    final = _shard_path(partial, index)
    tmp = final.with_name(f".{final.name}.tmp")
    fsops.write_file(tmp, head + b"".join(parts))
    fsops.rename(tmp, final)  # a shard on disk is always whole


def _read_shard(path: Path) -> tuple[Any, Any, Any]:
    """``(lengths, tokens, mask)`` of a finished shard, its CRC checked."""
    head = _shard_head(path)
    data = path.read_bytes() if head is not None else b""
    if head is None or zlib.crc32(data[_SHARD.size :]) != head[2]:
        fsops.unlink(path)
        raise DataError(f"{path}: a damaged shard of the unfinished build (removed; run again to redo it)")
    examples, tokens, _ = head
    at = _SHARD.size
    lengths = np.frombuffer(data, dtype=np.int64, count=examples, offset=at)
    at += 8 * examples
    ids = np.frombuffer(data, dtype=np.uint32, count=tokens, offset=at)
    mask = np.frombuffer(data, dtype=np.uint8, count=tokens, offset=at + 4 * tokens)
    return lengths, ids, mask


def _kept(partial: Path) -> tuple[int, int]:
    """How many finished shards, and examples in them, an unfinished build holds."""
    shards = examples = 0
    for path in partial.glob("shard-*.bin") if partial.is_dir() else []:
        head = _shard_head(path)
        if head is not None:
            shards, examples = shards + 1, examples + head[0]
    return shards, examples


def _disk_full(exc: OSError, where: Path) -> DataError:
    if exc.errno == errno.ENOSPC:
        return DataError(
            f"disk full while writing the cache in {where}; finished shards are kept there and a "
            "rerun resumes after space is freed"
        )
    return DataError(f"cannot write the cache in {where}: {exc.strerror or exc}")


# -- building ----------------------------------------------------------------------------------------------


def build_cache(
    data: str | Path,
    tokenizer: str | Path,
    out: str | Path,
    template: str = "auto",
    workers: int | None = None,
    skip_bad: bool = False,
    shard_size: int = SHARD_SIZE,
    on_progress: Callable[[int], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> Path:
    """Tokenize ``data`` into ``out/<key>/`` (or reuse it when it exists) and return that folder.

    ``on_progress(n)``: n more examples tokenized. ``on_note(text)``: something a user should hear (waiting
    for another build of the same cache, a damaged cache being rebuilt). Ctrl-C (or any
    ``KeyboardInterrupt``) surfaces as ``BuildInterrupted``, which says what is kept for the resume.
    """
    source = Path(data)
    if not source.exists():
        raise DataError(f"{source}: no such file or folder")
    if not source.is_dir():
        check_regular(source)  # hashed and read below: a FIFO would block the open forever
    if shard_size < 1:
        raise DataError(f"shard_size must be at least 1, not {shard_size}")
    info = describe_tokenizer(tokenizer)
    load_tokenizer(info)  # fail here, in one line, rather than in every worker
    key = cache_key(source, info, template, skip_bad)
    root = Path(out)
    final, partial, lock = root / key, root / f"{key}.partial", root / f"{key}.lock"
    if (final / "meta.json").is_file() and not partial.exists() and not lock.exists():
        try:
            open_cache(final)  # integrity-checked reuse, no lock needed
            return final
        except DataError:
            pass  # damaged: rebuilt below, under the lock
    note = on_note or (lambda _text: None)

    def waiting(pid: int | None) -> None:
        who = f"pid {pid}" if pid else "another process"
        note(f"{who} is building this cache ({final}); waiting for it to finish")

    try:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _disk_full(exc, root) from None
        with BuildLock(lock, on_wait=waiting):
            return _build_locked(
                source, info, template, skip_bad, key, final, partial, workers, shard_size, on_progress, note
            )
    except KeyboardInterrupt as exc:
        if isinstance(exc, BuildInterrupted):
            raise
        shards, examples = _kept(partial)
        assembling = (partial / "assembled").exists()
        raise BuildInterrupted(str(partial), shards, examples, assembling) from exc
    except OSError as exc:
        raise _disk_full(exc, partial) from None


def _build_locked(
    source: Path,
    info: TokenizerInfo,
    template: str,
    skip_bad: bool,
    key: str,
    final: Path,
    partial: Path,
    workers: int | None,
    shard_size: int,
    on_progress: Callable[[int], None] | None,
    note: Callable[[str], None],
) -> Path:
    """The build proper, with the lock held: every step below may be killed and rerun."""
    if final.exists():
        try:
            open_cache(final)
        except DataError as exc:
            note(f"{exc}; building it again")
            fsops.remove_tree(final)
        else:  # made by another build while we waited, or a kill came after the publishing rename
            fsops.remove_tree(partial)
            return final
    identity = json.dumps({"format": CACHE_FORMAT, "key": key, "shard_size": shard_size}).encode()
    stamp = partial / "build.json"
    if partial.exists() and not (stamp.is_file() and stamp.read_bytes() == identity):
        if stamp.is_file():
            note(f"{partial} was started with other settings (shard size); starting it over")
        fsops.remove_tree(partial)  # another layout, or killed before it had one: start over
    if not stamp.is_file():
        fsops.mkdir(partial)
        tmp = partial / ".build.json.tmp"
        fsops.write_file(tmp, identity)
        fsops.rename(tmp, stamp)
    report = ReadReport()
    examples = read_examples(source, skip_bad=skip_bad, report=report)

    def todo() -> Iterator[tuple[int, list[Example]]]:
        for index, batch in _shards(examples, shard_size):
            head = _shard_head(_shard_path(partial, index))
            if head is None or head[0] != len(batch):
                yield index, batch

    processes = max(1, workers if workers is not None else min(8, (os.cpu_count() or 2)))
    with _Workers(processes, info, template) as pool:
        for index, tokens, lengths, mask in pool.map(todo()):
            _write_shard(partial, index, tokens, lengths, mask)
            if on_progress is not None:
                on_progress(len(lengths))
    if report.examples == 0:
        fsops.remove_tree(partial)
        raise DataError(
            f"{source}: no usable examples" + (f" ({report.first_error})" if report.first_error else "")
        )
    _assemble(partial, final, key, source, info, template, report, shard_size)
    fsops.remove_tree(partial)
    return final


def _digests(data: bytes, into: dict[str, Any]) -> None:
    into["crc32"] = zlib.crc32(data, into.get("crc32", 0))
    into.setdefault("_sha", hashlib.sha256()).update(data)


def _assemble(
    partial: Path,
    final: Path,
    key: str,
    source: Path,
    info: TokenizerInfo,
    template: str,
    report: ReadReport,
    shard_size: int,
) -> None:
    """Write the cache into ``partial/assembled`` from the shards (left as they are), then publish it."""
    count = -(-report.examples // shard_size)
    paths = [_shard_path(partial, i) for i in range(count)]
    present = sorted(partial.glob("shard-*.bin"))
    heads = [_shard_head(p) for p in present]
    held = sum(h[0] for h in heads if h is not None)
    if present != paths or any(h is None for h in heads) or held != report.examples:
        fsops.remove_tree(partial)
        raise DataError(
            f"{partial}: its shards hold {held} examples, {source} has {report.examples}: a damaged "
            "unfinished build (removed; run again)"
        )
    max_id = 0
    for path in paths:
        _, ids, _ = _read_shard(path)
        if ids.size:
            max_id = max(max_id, int(ids.max()))
    dtype = np.uint16 if max_id < 2**16 else np.uint32
    stage = partial / "assembled"
    fsops.remove_tree(stage)  # what a killed assembly left
    fsops.mkdir(stage)
    sums: dict[str, dict[str, Any]] = {name: {} for name in ARRAYS}
    lengths: list[Any] = []
    trained = 0
    with fsops.create(stage / "tokens.bin") as tokens_out, fsops.create(stage / "mask.bin") as mask_out:
        for path in paths:
            shard_lengths, ids, mask = _read_shard(path)
            lengths.append(shard_lengths)
            block = ids.astype(dtype).tobytes()
            _digests(block, sums["tokens.bin"])
            tokens_out.write(block)
            trained += int(mask.sum(dtype=np.int64))
            _digests(mask.tobytes(), sums["mask.bin"])
            mask_out.write(mask.tobytes())
    all_lengths = np.concatenate(lengths)
    offsets = np.zeros(all_lengths.size + 1, dtype=np.int64)
    np.cumsum(all_lengths, out=offsets[1:])
    _digests(offsets.tobytes(), sums["offsets.bin"])
    fsops.write_file(stage / "offsets.bin", offsets.tobytes())
    meta = CacheMeta(
        format=CACHE_FORMAT,
        key=key,
        examples=int(all_lengths.size),
        tokens=int(offsets[-1]),
        trained_tokens=trained,
        token_dtype=np.dtype(dtype).name,
        source=str(source),
        tokenizer=str(info.path),
        tokenizer_fingerprint=info.fingerprint,
        template=template,
        skipped=report.skipped,
        layouts=dict(report.layouts or {}),
        checksums={
            name: {"crc32": s.get("crc32", 0), "sha256": s.get("_sha", hashlib.sha256()).hexdigest()}
            for name, s in sums.items()
        },
    )
    fsops.write_file(stage / "meta.json", json.dumps(asdict(meta), indent=1).encode())
    fsops.rename(stage, final)  # the only step that makes a cache visible: atomic on one filesystem
    fsops.sync_dir(final.parent)


# -- reading -----------------------------------------------------------------------------------------------

_checked: dict[tuple[str, int, int, int], int] = {}  # (file, inode, size, mtime) -> CRC-32 already read


def _file_crc(path: Path) -> int:
    st = check_regular(path)
    memo = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    if memo not in _checked:
        crc = 0
        with path.open("rb") as f:
            for block in iter(lambda: f.read(_BLOCK), b""):
                crc = zlib.crc32(block, crc)
        _checked[memo] = crc
    return _checked[memo]


class TokenCache:
    """A built cache, memory-mapped: example ``i`` is a view, never a copy."""

    def __init__(self, path: Path, meta: CacheMeta) -> None:
        self.path = path
        self.meta = meta
        for name in ARRAYS:
            check_regular(path / name)  # np.memmap / np.fromfile of a FIFO would block forever
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
        """Full check: every array's SHA-256 (reads every byte, as opening does for the CRC-32)."""
        for name in ARRAYS:
            digest = hashlib.sha256()
            check_regular(self.path / name)
            with (self.path / name).open("rb") as f:
                for block in iter(lambda: f.read(_BLOCK), b""):
                    digest.update(block)
            if digest.hexdigest() != self.meta.checksums[name]["sha256"]:
                raise DataError(
                    f"{self.path}: {name} checksum mismatch: a damaged cache (modified or corrupted)"
                )


def _read_meta(folder: Path) -> CacheMeta:
    problem = regular_problem(folder / "meta.json")
    if problem is not None:
        raise DataError(f"{problem}; rebuild the cache")
    try:
        raw = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{folder}: unreadable meta.json ({exc}); rebuild the cache") from None
    if isinstance(raw, dict) and isinstance(raw.get("format"), int) and raw["format"] != CACHE_FORMAT:
        raise DataError(
            f"{folder}: cache format {raw['format']}, this pitstop reads {CACHE_FORMAT}; rebuild it"
        )
    problem = _meta_problem(raw)
    if problem is not None:
        raise DataError(f"{folder}: invalid meta.json ({problem}); rebuild the cache")
    return CacheMeta(**raw)


def open_cache(path: str | Path, verify: bool = True) -> TokenCache:
    """Open ``path`` (a cache folder, or a folder holding exactly one) after checking its integrity.

    Sizes and offsets are always checked; ``verify`` (default) also reads every array for its CRC-32
    (once per process and file version), so a flipped byte in the tokens or the loss mask is refused.
    """
    folder = Path(path)
    problem = regular_problem(folder / "meta.json")
    if problem is not None:  # a FIFO there used to be called 'no complete cache' (and read, a hang)
        raise DataError(f"{problem}; rebuild the cache")
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
    meta = _read_meta(folder)
    width = np.dtype(meta.token_dtype).itemsize
    expected = {
        "tokens.bin": meta.tokens * width,
        "mask.bin": meta.tokens,
        "offsets.bin": (meta.examples + 1) * 8,
    }
    for name, size in expected.items():
        problem = regular_problem(folder / name)
        if problem is not None:
            raise DataError(f"{problem}: a damaged cache")
        actual = (folder / name).stat().st_size if (folder / name).is_file() else -1
        if actual != size:
            shown = "missing" if actual < 0 else f"{actual} bytes"
            raise DataError(f"{folder}: {name} is {shown}, meta.json says {size} bytes: a damaged cache")
    offsets = np.fromfile(folder / "offsets.bin", dtype=np.int64)
    if (
        zlib.crc32(offsets.tobytes()) != meta.checksums["offsets.bin"]["crc32"]
        or offsets[0] != 0
        or offsets[-1] != meta.tokens
        or bool(np.any(np.diff(offsets) < 0))
    ):
        raise DataError(f"{folder}: offsets do not match meta.json: a damaged cache")
    if verify:
        for name in ("tokens.bin", "mask.bin"):
            if _file_crc(folder / name) != meta.checksums[name]["crc32"]:
                raise DataError(
                    f"{folder}: {name} checksum mismatch: a damaged cache (modified or corrupted)"
                )
    return TokenCache(folder, meta)
