"""What makes two runs comparable: the same model, hardware, sequence length and batch.

Only the *workload and platform* enter the fingerprint. Settings that a fix changes (attention path,
dtype, DataLoader workers, packing) stay out on purpose: a run that lost FlashAttention must land next to
its baseline and show up as a regression, not start a new history. Library versions stay out for the same
reason: a run after an upgrade lands next to the run before it, so a regression the upgrade brought is seen
(``versions_of`` reads them from the stored document; ``history compare`` / ``check`` name what changed).

Histories written before kept the versions (``major.minor``) in the fingerprint. Such a row is matched by the
fingerprint of its fields without them (``matching_fingerprint``), so an old history reads on as one.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

MODEL_FIELDS = ("model_type", "params_total", "n_layers", "hidden_size")
OLD_VERSIONS_FIELD = "versions"  # a field of fingerprints written before versions left them


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
    fields: dict[str, Any] = {name: model.get(name) for name in MODEL_FIELDS}
    fields.update(
        device=env.get("device"),
        gpu_name=env.get("gpu_name"),
        gpu_count=env.get("gpu_count"),
        world_size=env.get("world_size"),
        seq_len=sequence_length(doc),
        micro_batch_size=env.get("micro_batch_size"),
        grad_accum_steps=env.get("grad_accum_steps"),
    )
    return fields


def versions_of(doc: Any) -> dict[str, str]:
    """The library versions a run or tune document recorded (a tune's: its baseline run's), as written."""
    if isinstance(doc, dict) and isinstance(doc.get("baseline_run"), dict):
        doc = doc["baseline_run"]
    env = doc.get("environment") if isinstance(doc, dict) else None
    versions = env.get("versions") if isinstance(env, dict) else None
    if not isinstance(versions, dict):
        return {}
    return {str(k): str(v) for k, v in sorted(versions.items()) if v}


def current_fields(stored: dict[str, Any]) -> dict[str, Any]:
    """Stored fingerprint fields as this pitstop fingerprints: an older row's ``versions`` left out."""
    return {k: v for k, v in stored.items() if k != OLD_VERSIONS_FIELD}


def matching_fingerprint(stored_fingerprint: str, stored: dict[str, Any]) -> str:
    """The fingerprint a stored row is matched by: its own, or for a row written while versions were part
    of the fingerprint, the fingerprint of its fields without them."""
    if OLD_VERSIONS_FIELD not in stored:
        return stored_fingerprint
    return fingerprint_of(current_fields(stored))


def canonical_json(fields: dict[str, Any]) -> str:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def fingerprint_of(fields: dict[str, Any]) -> str:
    """Canonical JSON → sha256 → the first 12 hex digits."""
    return hashlib.sha256(canonical_json(fields).encode()).hexdigest()[:12]


def fingerprint(doc: dict[str, Any]) -> str:
    return fingerprint_of(fingerprint_fields(doc))
