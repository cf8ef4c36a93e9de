"""Opening artifacts safely: gzip by magic bytes (not by name), size limits, text decoding."""

from __future__ import annotations

import gzip
import io
import zlib
from pathlib import Path
from typing import BinaryIO

from pitstop.ingest.errors import IngestError

GZIP_MAGIC = b"\x1f\x8b"
CONFIG_LIMIT = 16 * 2**20  # configs, CSV logs and Trainer outputs are small; refuse to slurp anything bigger


def is_gzip(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_binary(path: Path) -> BinaryIO:
    """A binary stream of the file's content, decompressed when it is gzip."""
    try:
        if is_gzip(path):
            return gzip.open(path, "rb")  # type: ignore[return-value]
        return path.open("rb")
    except OSError as exc:
        raise IngestError(f"{path}: cannot open ({exc.strerror or exc})") from None


def head(path: Path, size: int = 65536) -> bytes:
    """The first ``size`` bytes of the (decompressed) content; a truncated gzip yields what it has."""
    with open_binary(path) as f:
        try:
            return f.read(size)
        except (EOFError, OSError, zlib.error):
            return b""


def read_text(path: Path, limit: int = CONFIG_LIMIT) -> str:
    """The whole (decompressed) file as text, refusing files over ``limit`` bytes."""
    with open_binary(path) as f:
        try:
            data = f.read(limit + 1)
        except (EOFError, zlib.error) as exc:
            raise IngestError(f"{path}: truncated or corrupt gzip ({exc})") from None
        except OSError as exc:
            raise IngestError(f"{path}: cannot read ({exc})") from None
    if len(data) > limit:
        raise IngestError(f"{path}: larger than {limit // 2**20} MiB, which no config or log of this kind is")
    for encoding in ("utf-8-sig", "latin-1"):
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            continue
    raise IngestError(f"{path}: not text")  # pragma: no cover - latin-1 decodes any byte string


def text_stream(data: bytes) -> io.StringIO:
    return io.StringIO(data.decode("utf-8", errors="replace"))
