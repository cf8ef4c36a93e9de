"""How findings are ordered and how severe they are: expected time saved (confidence × estimated saving);
severity rates the effect, capped by the strength of the evidence."""

from __future__ import annotations

from pitstop.core.findings import Finding, Fix, rank_findings
from pitstop.core.vocabulary import Severity


def _finding(cause: str, severity: str, confidence: float, speedup: float | None) -> Finding:
    return Finding(cause, Severity(severity), confidence, "s", {}, speedup, "b", Fix("t"))


def test_weak_evidence_does_not_outrank_strong_evidence_of_a_similar_effect() -> None:
    strong = _finding("idle_gpu", "high", 0.85, 2.0)
    weak = _finding("small_batch", "high", 0.4, 2.2)  # a larger estimate, resting on a log's mean
    assert rank_findings([weak, strong]) == [strong, weak]
    assert weak.severity is Severity.MEDIUM  # HIGH needs strong evidence


def test_a_much_larger_effect_still_ranks_first() -> None:
    modest = _finding("dataloader_bound", "medium", 0.9, 1.1)
    large = _finding("padding_waste", "high", 0.6, 3.0)
    assert rank_findings([modest, large]) == [large, modest]


def test_severity_caps() -> None:
    assert _finding("small_batch", "high", 0.9, 2.0).severity is Severity.HIGH
    assert _finding("small_batch", "high", 0.5, 2.0).severity is Severity.MEDIUM
    assert _finding("small_batch", "medium", 0.3, 2.0).severity is Severity.LOW
    assert _finding("small_batch", "high", 0.9, float("nan")).est_speedup is None
