"""Writing a file so that a reader, or a crash at any moment, sees the old content or the new, never half."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_atomic(path: Path | str, data: str | bytes, *, fsync: bool = False) -> None:
    """Write ``data`` beside ``path`` under a private name, then rename it over ``path`` in one step.

    ``fsync`` makes the new content durable before the rename (for caches and histories that must survive a
    power loss, not only a killed process).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
