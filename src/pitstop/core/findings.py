"""Findings: the product. A cause, its evidence, how sure we are, what fixing it is worth, and the fix."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pitstop.core.vocabulary import CauseId, RemedyId, Severity


@dataclass(frozen=True)
class Use:
    """A rule's (or tune's) reference to a remedy with the parameters the evidence gave it."""

    remedy: RemedyId
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def to_dict(self) -> dict[str, Any]:
        return {"id": str(self.remedy), "params": dict(self.params)}


def use(remedy: RemedyId, **params: Any) -> Use:
    return Use(remedy, MappingProxyType(params))


@dataclass
class Fix:
    """A sentence saying what to change, plus code for each framework it applies to.

    ``snippets`` maps a framework (``pitstop.core.vocabulary.Framework``) to a snippet; ``framework`` names the one
    detected for this run, shown first. Built by ``pitstop.remedies.advise`` from the remedies in ``uses``.
    """

    text: str
    snippets: dict[str, str] = field(default_factory=dict)
    framework: str | None = None
    uses: tuple[Use, ...] = ()

    @property
    def snippet(self) -> str | None:
        """The snippet for the detected framework, else plain PyTorch, else the first one."""
        if self.framework and self.framework in self.snippets:
            return self.snippets[self.framework]
        if "pytorch" in self.snippets:
            return self.snippets["pytorch"]
        return next(iter(self.snippets.values()), None)


@dataclass(frozen=True)
class Saving:
    """What fixing a finding would save over the rest of the run: remaining steps × step time × (1 − 1/speed-up)
    of wall time, that × the job's GPUs in GPU-hours, and at a price per GPU-hour the money
    (``diagnose/savings.py``). Only where the run's length is known; never guessed."""

    seconds: float  # wall time saved
    gpu_hours: float  # seconds × gpus / 3600
    remaining_steps: int  # optimizer steps left when measured
    total_steps: int  # the run's length
    step_s: float  # the step time the remaining steps are counted at
    gpus: int
    length_from: str  # who said how long the run is ("the Trainer's max_steps", "--total-steps")
    price_per_gpu_hour: float | None = None
    money: float | None = None  # gpu_hours × price, in the price's currency

    def to_dict(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 1),
            "gpu_hours": round(self.gpu_hours, 4),
            "remaining_steps": self.remaining_steps,
            "total_steps": self.total_steps,
            "step_s": round(self.step_s, 6),
            "gpus": self.gpus,
            "length_from": self.length_from,
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "money": None if self.money is None else round(self.money, 2),
        }

    @classmethod
    def from_dict(cls, data: Any) -> Saving | None:
        """A saved saving, or None where the document has none or a damaged one (a saving is a help)."""
        if not isinstance(data, dict):
            return None
        try:
            price, money = data.get("price_per_gpu_hour"), data.get("money")
            saving = cls(
                seconds=float(data["seconds"]),
                gpu_hours=float(data["gpu_hours"]),
                remaining_steps=int(data["remaining_steps"]),
                total_steps=int(data["total_steps"]),
                step_s=float(data["step_s"]),
                gpus=int(data["gpus"]),
                length_from=str(data["length_from"]),
                price_per_gpu_hour=None if price is None else float(price),
                money=None if money is None else float(money),
            )
        except (KeyError, TypeError, ValueError, OverflowError):  # int(inf) overflows, int(nan) is ValueError
            return None
        figures = (saving.seconds, saving.gpu_hours, saving.step_s, saving.price_per_gpu_hour, saving.money)
        # float("nan") and float("inf") parse: a report must not say "nan s ($inf)" from a damaged document
        return saving if all(x is None or math.isfinite(x) for x in figures) else None


@dataclass
class Finding:
    cause: CauseId
    severity: Severity
    confidence: float  # 0..1: how sure we are that this cause is present
    summary: str
    evidence: dict[str, Any]
    est_speedup: float | None  # step-time ratio before/after if fixed (>= 1), None when not estimable
    speedup_basis: str
    fix: Fix
    saving: Saving | None = None  # over the rest of the run, where its length is known (diagnose/savings.py)
    title: str = (
        ""  # the cause's heading, set by the cause's rule (``diagnose/causes``) or read from a document
    )

    def __post_init__(self) -> None:
        self.cause = CauseId(self.cause)  # an unknown id fails loudly (ValueError)
        self.severity = Severity(self.severity)
        # A number computed from a damaged input must not reach a report as "×nan" or "-5 %": a speed-up
        # that is not finite is not estimable, a confidence is clamped to 0..1 (NaN means no confidence).
        if self.est_speedup is not None and not math.isfinite(self.est_speedup):
            self.est_speedup = None
        if self.est_speedup is not None and self.est_speedup < 1.0:
            self.est_speedup = 1.0
        self.confidence = min(1.0, max(0.0, self.confidence)) if math.isfinite(self.confidence) else 0.0
        self.evidence = _finite(self.evidence)
        self.severity = capped_by_confidence(self.severity, self.confidence)

    @property
    def time_saved_frac(self) -> float:
        """Share of step time this fix would save: 1 - 1/speed-up (0 when unknown)."""
        if not self.est_speedup:
            return 0.0
        return 1.0 - 1.0 / self.est_speedup

    def to_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "title": self.title,
            "severity": self.severity,
            "confidence": round(self.confidence, 2),
            "est_speedup": None if self.est_speedup is None else round(self.est_speedup, 3),
            "speedup_basis": self.speedup_basis,
            "evidence": self.evidence,
            "summary": self.summary,
            "fix": {
                "text": self.fix.text,
                "framework": self.fix.framework,
                "snippets": self.fix.snippets,
                "remedies": [u.to_dict() for u in self.fix.uses],
            },
            "saving": None if self.saving is None else self.saving.to_dict(),
        }

    @property
    def expected_saving(self) -> float:
        """The share of step time we expect fixing it to save: how sure we are × what it would save."""
        return self.confidence * self.time_saved_frac


STRONG_EVIDENCE = 0.7  # confidence from which a finding may be HIGH
SOME_EVIDENCE = 0.4  # below it, LOW whatever the effect


def capped_by_confidence(severity: Severity | str, confidence: float) -> Severity:
    """Severity states the effect's size *and* the evidence's strength: a rule rates the effect; thin
    evidence (a log's mean, a config alone) caps it — at most MEDIUM below 0.7 confidence, LOW below 0.4."""
    rated = Severity(severity)
    if confidence < SOME_EVIDENCE:
        return Severity.LOW
    if confidence < STRONG_EVIDENCE and rated is Severity.HIGH:
        return Severity.MEDIUM
    return rated


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinity (in nested dicts and lists) replaced by None: unknown, not a number."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if type(value) in (list, tuple):  # not a named tuple, whose constructor takes fields
        return type(value)(_finite(v) for v in value)
    return value


def rank_findings(findings: list[Finding]) -> list[Finding]:
    """Order by expected time saved (confidence × estimated saving), then severity, then confidence: weak
    evidence of a large effect does not outrank strong evidence of a similar one."""
    return sorted(findings, key=lambda f: (-f.expected_saving, Severity(f.severity).order, -f.confidence))
