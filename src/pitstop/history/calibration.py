"""How well each rule's estimate predicted what ``pitstop tune`` then measured, on this user's own jobs.

Every tune document keeps, per measured fix, the speed-up its finding predicted and the one measured
(``predicted_vs_measured``). Read back from the history they say, per cause, how far the rule's estimates are
from this machine and these jobs (``pitstop history calibration``), and a later diagnosis of a job with the
same fingerprint has its estimates scaled by what was measured on it, said in each finding's basis.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pitstop.core.findings import Finding, rank_findings
from pitstop.history.store import HistoryStore

DECIDED = ("kept", "within noise", "slower")  # what a measurement can calibrate; undecided calibrates nothing


@dataclass(frozen=True)
class Pair:
    """One fix of one tune run: the speed-up its finding predicted and the one tune measured."""

    run_id: int
    cause: str
    fix: str
    predicted: float
    measured: float


@dataclass(frozen=True)
class CauseCalibration:
    """A cause's predicted/measured pairs and what they say together."""

    cause: str
    pairs: tuple[Pair, ...]

    @property
    def factor(self) -> float:
        """The median of measured / predicted: what an estimate of this cause is multiplied by."""
        return statistics.median(p.measured / p.predicted for p in self.pairs)

    @property
    def error(self) -> float:
        """The median |log(predicted / measured)|: 0.2 is an estimate within about 22% of the measurement."""
        return statistics.median(abs(math.log(p.predicted / p.measured)) for p in self.pairs)

    @property
    def runs(self) -> list[int]:
        return sorted({p.run_id for p in self.pairs})

    def to_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "pairs": [vars(p) for p in self.pairs],
            "measured_over_predicted": round(self.factor, 4),
            "median_abs_log_error": round(self.error, 4),
        }


def _number(value: object) -> float | None:
    ok = (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )
    return float(value) if ok else None  # type: ignore[arg-type]


def tune_pairs(run_id: int, doc: Mapping[str, Any]) -> Iterator[Pair]:
    """The decided pairs of one stored tune document; anything malformed in it is skipped, never trusted."""
    rows = doc.get("predicted_vs_measured")
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict) or row.get("status") not in DECIDED:
            continue
        predicted, measured = _number(row.get("predicted")), _number(row.get("measured"))
        cause, fix = row.get("cause"), row.get("fix")
        if predicted and measured and isinstance(cause, str) and isinstance(fix, str):
            yield Pair(run_id, cause, fix, predicted, measured)


def calibrations(store: HistoryStore, fingerprint: str | None = None) -> list[CauseCalibration]:
    """Every cause that tune measured in this history (only on jobs of ``fingerprint`` when given)."""
    by_cause: dict[str, list[Pair]] = {}
    for summary in store.list(limit=None, kind="tune"):
        if fingerprint is not None and summary.fingerprint != fingerprint:
            continue
        run = store.get(summary.id)
        for pair in tune_pairs(summary.id, (run.result if run else None) or {}):
            by_cause.setdefault(pair.cause, []).append(pair)
    return [CauseCalibration(cause, tuple(pairs)) for cause, pairs in sorted(by_cause.items())]


def corrected(findings: list[Finding], known: list[CauseCalibration]) -> tuple[list[Finding], list[str]]:
    """The findings with each calibrated cause's estimate scaled by what tune measured on this job, re-ranked,
    and a note per correction. A finding without an estimate is left as it is."""
    by_cause = {c.cause: c for c in known}
    out: list[Finding] = []
    notes: list[str] = []
    for finding in findings:
        cal = by_cause.get(finding.cause)
        if cal is None or finding.est_speedup is None:
            out.append(finding)
            continue
        runs = ", ".join(f"#{r}" for r in cal.runs)
        said = (
            f"; corrected ×{cal.factor:.2f} by what tune measured on this job ({len(cal.pairs)} "
            f"measurement{'s' if len(cal.pairs) != 1 else ''}, history run {runs}): "
            f"×{finding.est_speedup:.2f} estimated by the rule"
        )
        out.append(
            replace(
                finding,
                est_speedup=finding.est_speedup * cal.factor,
                speedup_basis=finding.speedup_basis + said,
            )
        )
        notes.append(
            f"{finding.cause}: estimate corrected ×{cal.factor:.2f} by {len(cal.pairs)} tune measurement"
            f"{'s' if len(cal.pairs) != 1 else ''} of this job (history run {runs})"
        )
    return rank_findings(out), notes
