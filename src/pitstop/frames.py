"""The job's line behind a call pitstop intercepted: the first stack frame, from the interceptor outwards,
whose file is not pitstop's nor one of the libraries the call passed through. One walker for the probe's
collectors and the trials' patches, which name the line the same way."""

from __future__ import annotations

import os
from types import FrameType

PITSTOP_DIR = os.path.dirname(os.path.abspath(__file__))  # .../pitstop: never the job's line
TORCH_AND_LIGHTNING = (
    f"{os.sep}torch{os.sep}",
    f"{os.sep}lightning{os.sep}",
    f"{os.sep}pytorch_lightning{os.sep}",
)


def job_line(
    frame: FrameType | None,
    *,
    skip_parts: tuple[str, ...] = TORCH_AND_LIGHTNING,
    skip_prefixes: tuple[str, ...] = (),
    with_function: bool = False,
) -> str | None:
    """``"path:line"`` (``"path:line in function"`` with ``with_function``) of the first frame from ``frame``
    outwards whose file is not pitstop's, starts with none of ``skip_prefixes`` and holds none of
    ``skip_parts``; None when every frame is one of those."""
    skip = (PITSTOP_DIR, *skip_prefixes)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(skip) and not any(part in name for part in skip_parts):
            where = f"{name}:{frame.f_lineno}"
            return f"{where} in {frame.f_code.co_name}" if with_function else where
        frame = frame.f_back
    return None
