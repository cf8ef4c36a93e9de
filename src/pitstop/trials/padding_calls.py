"""The job's tokenizer calls that pad every example to a fixed length (``padding="max_length"``).

A job that pads at tokenization hands its collator rows that are all ``max_length`` long: the collator (a
``DataCollatorForLanguageModeling`` pads each batch to its longest row) has nothing left to pad, and the
one-line fix is in the job's own code: drop the argument. The probe (to name that line in a finding) and the
``trim_padding`` trial (to name it in the change tune keeps) both watch ``PreTrainedTokenizerBase.__call__``
through this one wrapper: each call costs a dict lookup; the first call that pads to ``max_length`` is kept,
with the job's line and its code.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import re
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from pitstop.frames import TORCH_AND_LIGHTNING, job_line

PACKAGES = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
_MARK = "_pitstop_padding_watch"
# the argument as a job writes it, with the comma that joins it to its neighbours
_ARGUMENT = re.compile(
    r"""(,\s*padding\s*=\s*(["'])max_length\2)|(padding\s*=\s*(["'])max_length\4\s*,\s*)"""
)


@dataclass(frozen=True)
class PaddingCall:
    """The first tokenizer call that padded to a fixed length: to how many tokens, from which job line."""

    pads_to: int | None  # max_length, or the tokenizer's model_max_length when the call gave none
    site: str | None  # "path:line" of the job's call; None when a library made the call
    code: str | None  # that line, stripped


_seen: list[PaddingCall] = []


def seen() -> PaddingCall | None:
    """The first padding call watched in this process, or None."""
    return _seen[0] if _seen else None


def without_padding(code: str | None) -> str | None:
    """The job's line with ``padding="max_length"`` dropped; None when the line does not spell it so."""
    if not code:
        return None
    changed, n = _ARGUMENT.subn("", code, count=1)
    return changed if n else None


def _caller_line(frame: Any) -> tuple[str | None, str | None]:
    """The job's line that called the tokenizer: the first frame outside pitstop and torch must be the job's
    own (not an installed library's, which would name a line the job cannot change)."""
    site = job_line(frame, skip_parts=TORCH_AND_LIGHTNING)
    if site is None or any(p in site for p in PACKAGES) or site.startswith("<"):
        return None, None
    path, _, line = site.rpartition(":")
    code = linecache.getline(path, int(line)).strip() if line.isdigit() else ""
    return site, code or None


def _record(tokenizer: Any, kwargs: dict[str, Any], frame: Any) -> None:
    if _seen:
        return
    length = kwargs.get("max_length") or getattr(tokenizer, "model_max_length", None)
    site, code = _caller_line(frame)
    _seen.append(PaddingCall(int(length) if isinstance(length, int) else None, site, code))


def watch(module: ModuleType) -> None:
    """Wrap ``PreTrainedTokenizerBase.__call__`` of ``transformers.tokenization_utils_base`` (once)."""
    base = getattr(module, "PreTrainedTokenizerBase", None)
    original = base.__dict__.get("__call__") if base is not None else None
    if base is None or original is None or getattr(original, _MARK, False):
        return

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _seen and kwargs.get("padding") == "max_length":  # a PaddingStrategy equals its value
            with contextlib.suppress(Exception):  # never into the job
                _record(self, kwargs, sys._getframe(1))
        return original(self, *args, **kwargs)

    setattr(__call__, _MARK, True)
    __call__.__wrapped__ = original  # type: ignore[attr-defined]
    base.__call__ = __call__
