"""Writing a file so that a reader, or a crash at any moment, sees the old content or the new, never half.

Only a regular file (or a missing one) is replaced that way. What the path names is respected: a symbolic
link is followed, so the file it points to gets the new content and the link stays a link; a character
device, a FIFO or a socket is written in place (``/dev/stdout``, ``/dev/null``, a pipe to another process),
never replaced by a regular file, which as root would replace the device for every process on the machine;
a folder is refused (``IsADirectoryError``).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


def target_kind(path: Path | str) -> str:
    """What writing to ``path`` would meet (links followed): ``missing``, ``file``, ``folder`` or ``special``
    (a device, FIFO or socket, written in place)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "missing"  # missing, or a parent that is not a folder, or a link loop: the write says which
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "folder"
    return "special"


def _write_in_place(path: Path, payload: bytes) -> None:
    """A device or FIFO: opened for writing as a shell redirection would (a FIFO waits for its reader)."""
    fd = os.open(path, os.O_WRONLY | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "wb") as f:
        f.write(payload)


def write_atomic(path: Path | str, data: str | bytes, *, fsync: bool = False) -> None:
    """Write ``data`` beside ``path`` under a private name, then rename it over ``path`` in one step.

    A link is resolved first (the rename lands where it points); a device, FIFO or socket is written in
    place; a folder raises ``IsADirectoryError``. ``fsync`` makes the new content durable before the rename
    (for caches and histories that must survive a power loss, not only a killed process).
    """
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    kind = target_kind(path)
    if kind == "folder":
        raise IsADirectoryError(21, "is a folder", str(path))
    if kind == "special":
        _write_in_place(path, payload)
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
