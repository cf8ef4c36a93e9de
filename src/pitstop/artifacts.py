"""Opening artifacts safely: regular files only, gzip by magic bytes (not by name), size limits, text decoding;
and ``IngestError``, the one error for an artifact that cannot be read (ingest and the trace engine raise it).

Only regular files are opened: a FIFO would block the open forever and a device (``/dev/zero``) never ends.
A regular file that reports size 0 is refused as empty before it is read, which also keeps pseudo-files
(``/proc/kmsg`` reports 0 bytes and blocks on read) out.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path
from typing import BinaryIO

from pitstop.errors import PitstopError
from pitstop.regular import regular_stat


class IngestError(PitstopError):
    """An artifact cannot be read at all (as opposed to read with a stated limitation): one line, one file."""


GZIP_MAGIC = b"\x1f\x8b"
CONFIG_LIMIT = (
    64 * 2**20
)  # configs, Trainer outputs and model configs are small; refuse to slurp anything bigger


def check_regular(path: Path) -> os.stat_result:
    """The file's status (links followed), or a one-line IngestError when it is not a non-empty regular file."""
    return regular_stat(path, IngestError)


def is_gzip(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_binary(path: Path) -> BinaryIO:
    """A binary stream of the file's content, decompressed when it is gzip."""
    check_regular(path)
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


def read_bytes(path: Path, limit: int = CONFIG_LIMIT) -> bytes:
    """The whole (decompressed) content, refusing more than ``limit`` bytes without reading past it."""
    with open_binary(path) as f:
        try:
            data = f.read(limit + 1)
        except (EOFError, zlib.error) as exc:
            raise IngestError(f"{path}: truncated or corrupt gzip ({exc})") from None
        except OSError as exc:
            raise IngestError(f"{path}: cannot read ({exc})") from None
    if len(data) > limit:
        raise IngestError(f"{path}: larger than {limit // 2**20} MiB, which no config or log of this kind is")
    return data


def decode(data: bytes) -> str:
    for encoding in ("utf-8-sig", "latin-1"):
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            continue
    raise AssertionError("latin-1 decodes any byte string")  # pragma: no cover


def read_text(path: Path, limit: int = CONFIG_LIMIT) -> str:
    """The whole (decompressed) file as text, refusing files over ``limit`` bytes."""
    return decode(read_bytes(path, limit))
