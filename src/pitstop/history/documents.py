"""What a history row takes from a ``pitstop.run/1`` or ``pitstop.tune/1`` document."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import Any

from pitstop import schemas
from pitstop.history.errors import HistoryError
from pitstop.history.fingerprint import fingerprint_fields

METRIC_COLUMNS = ("real_tokens_per_s", "tokens_per_s", "step_time_s", "mfu")
# read from the stored document itself (no column): what a real token cost, where the run measured it
STORED_FIGURES = {
    "joules_per_real_token": "energy per real token",
    "cost_per_million_real_tokens": "cost per million real tokens",
}


@dataclass
class Summary:
    """The indexed columns of one stored result."""

    command: str | None
    fingerprint_fields: dict[str, Any]
    metrics: dict[str, float | None]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _command(value: Any) -> str | None:
    if isinstance(value, list):
        return shlex.join(str(part) for part in value)
    return value if isinstance(value, str) and value else None


def _is_run(doc: dict[str, Any]) -> bool:

    if "schema" in doc:
        return doc["schema"] == schemas.RUN
    return isinstance(doc.get("metrics"), dict) and isinstance(doc.get("environment"), dict)


def _is_tune(doc: dict[str, Any]) -> bool:
    if "schema" in doc:
        return doc["schema"] == schemas.TUNE
    return isinstance(doc.get("baseline_run"), dict)


def summarize(doc: Any) -> Summary:
    """The command, fingerprint and headline metrics of a run or tune document.

    A tune document is fingerprinted by its baseline window. Its throughput is the best configuration's
    (the baseline's when no fix helped); the other metrics were measured only for the baseline, so they
    are stored only when the baseline is the result.
    """
    if not isinstance(doc, dict):
        raise HistoryError(
            f"a result to record is a {schemas.RUN} or {schemas.TUNE} object, not a {type(doc).__name__}"
        )
    if _is_tune(doc):
        run = doc.get("baseline_run")
        if not isinstance(run, dict) or not _is_run(run):
            raise HistoryError(f"{schemas.TUNE} document without a {schemas.RUN} 'baseline_run'")
        best = doc.get("best") or {}
        baseline = doc.get("baseline") or {}
        best_tps = _number(best.get("real_tokens_per_s")) if isinstance(best, dict) else None
        run_metrics = run.get("metrics") or {}
        if best_tps is not None:
            metrics: dict[str, float | None] = dict.fromkeys(METRIC_COLUMNS)
            metrics["real_tokens_per_s"] = best_tps
        else:
            metrics = {name: _number(run_metrics.get(name)) for name in METRIC_COLUMNS}
            base_tps = _number(baseline.get("real_tokens_per_s")) if isinstance(baseline, dict) else None
            if base_tps is not None:
                metrics["real_tokens_per_s"] = base_tps
        return Summary(
            _command(run.get("command")) or _command(doc.get("command")), fingerprint_fields(run), metrics
        )
    if _is_run(doc):
        run_metrics = doc.get("metrics") or {}
        return Summary(
            _command(doc.get("command")),
            fingerprint_fields(doc),
            {name: _number(run_metrics.get(name)) for name in METRIC_COLUMNS},
        )
    raise HistoryError(
        f"not a {schemas.RUN} or {schemas.TUNE} document (schema: {doc.get('schema', 'none')!r})"
    )


def stored_figures(doc: Any) -> dict[str, float]:
    """The energy and cost per real token a stored run document holds (a tune's: its baseline run's), those
    it had: a run without a GPU power reading or a price has none, nor has a document older than them."""
    if isinstance(doc, dict) and _is_tune(doc):
        doc = doc.get("baseline_run")
    if not isinstance(doc, dict):
        return {}
    metrics, cost = doc.get("metrics"), doc.get("cost")
    values = {
        "joules_per_real_token": _number(metrics.get("joules_per_real_token"))
        if isinstance(metrics, dict)
        else None,
        "cost_per_million_real_tokens": _number(cost.get("per_million_real_tokens"))
        if isinstance(cost, dict)
        else None,
    }
    return {k: v for k, v in values.items() if v is not None}
