"""What makes two runs comparable: the same model, hardware, sequence length, batch and libraries.

Only the *workload and platform* enter the fingerprint. Settings that a fix changes (attention path,
dtype, DataLoader workers, packing) stay out on purpose: a run that lost FlashAttention must land next to
its baseline and show up as a regression, not start a new history. Library versions enter as
``major.minor``, so a patch release does not split history but a minor upgrade (which does change kernels)
does.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

MODEL_FIELDS = ("model_type", "params_total", "n_layers", "hidden_size")
_VERSION = re.compile(r"^(\d+)\.(\d+)")


def minor_version(version: str) -> str:
    """``"2.5.1+cu124"`` → ``"2.5"``; a version without a dotted number is kept whole."""
    match = _VERSION.match(version.strip())
    return f"{match[1]}.{match[2]}" if match else version.strip()


def _power_of_two_ceil(value: float) -> int:
    return 1 << max(0, math.ceil(math.log2(value))) if value > 1 else 1


def _configured_max_len(doc: dict[str, Any]) -> int | None:
    """The maximum length a config set (``pitstop analyze`` / ``check``), wherever the document has it."""
    profile = doc.get("profile") or {}
    ranks = profile.get("ranks") or [{}]
    for env in (
        doc.get("environment") or {},
        profile.get("run_environment") or {},
        (ranks[0] or {}).get("environment") or {},
    ):
        value = env.get("max_seq_len")
        if isinstance(value, int | float) and value > 0:
            return int(value)
    return None


def sequence_length(doc: dict[str, Any]) -> int | None:
    """The configured maximum length if known, else the measured mean rounded up to a power of two.

    Rounding up to a power of two keeps runs that pad to the longest example of each batch (whose mean
    length moves with the data in the window) in one history, while 1k and 4k contexts stay apart.
    """
    configured = _configured_max_len(doc)
    if configured is not None:
        return configured
    measured = (doc.get("metrics") or {}).get("seq_len")
    if isinstance(measured, int | float) and math.isfinite(measured) and measured > 0:
        return _power_of_two_ceil(float(measured))
    return None


def fingerprint_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """The fields of a ``pitstop.run/1`` document that decide what it may be compared with."""
    env = doc.get("environment") or {}
    model = env.get("model") or {}
    versions = env.get("versions") or {}
    fields: dict[str, Any] = {name: model.get(name) for name in MODEL_FIELDS}
    fields.update(
        device=env.get("device"),
        gpu_name=env.get("gpu_name"),
        gpu_count=env.get("gpu_count"),
        world_size=env.get("world_size"),
        seq_len=sequence_length(doc),
        micro_batch_size=env.get("micro_batch_size"),
        grad_accum_steps=env.get("grad_accum_steps"),
        versions={str(k): minor_version(str(v)) for k, v in sorted(versions.items()) if v},
    )
    return fields


def canonical_json(fields: dict[str, Any]) -> str:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def fingerprint_of(fields: dict[str, Any]) -> str:
    """Canonical JSON → sha256 → the first 12 hex digits."""
    return hashlib.sha256(canonical_json(fields).encode()).hexdigest()[:12]


def fingerprint(doc: dict[str, Any]) -> str:
    return fingerprint_of(fingerprint_fields(doc))
