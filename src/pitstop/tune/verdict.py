"""Turning windows into decisions: speed-up against the baseline with its uncertainty, the loss check for
fixes that should preserve the computation, kept or rejected and why."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pitstop.core.vocabulary import CauseId
from pitstop.remedies import Remedy
from pitstop.tune.window import Window

MIN_GAIN = 0.03  # below this a fix is not worth a change to the job, however sure the measurement
UNDECIDED = "undecided"  # within noise on a machine too noisy to tell: neither kept nor ruled out
LOSS_RTOL = 1e-3  # fp32 on CPU: kernels and summation order move losses by ~1e-6
LOSS_RTOL_GPU = 2e-2  # TF32 / reduced-precision kernels on a GPU


@dataclass
class Baseline:
    real_tokens_per_s: float
    spread: float  # relative uncertainty, drift between the two baseline windows included
    start: float
    end: float | None
    losses: list[float]
    losses_reproducible: bool | None  # whether the two baseline windows had the same first losses
    windows: int = 1  # baseline windows that ran
    disagreement: float | None = None  # (fastest − slowest) / mean of those windows; None with one window
    own_spread: float = 0.0  # the windows' own relative standard error (rms), drift left out

    @property
    def drift(self) -> float | None:
        return None if self.end is None else self.end / self.start - 1.0

    @property
    def resolvable(self) -> float:
        """The smallest effect the run can resolve on a steady machine: a fix must beat the baseline by
        ``MIN_GAIN`` and by twice the uncertainty of two windows of this precision."""
        return resolvable(self.own_spread)

    @property
    def noisy(self) -> bool:
        """Whether identical baseline windows disagreed by more than the smallest effect the run resolves:
        then a fix that shows no gain was not shown to have none."""
        return self.disagreement is not None and self.disagreement > self.resolvable


def resolvable(own_spread: float) -> float:
    """``MIN_GAIN`` or twice the uncertainty of a candidate against a baseline of ``own_spread`` each."""
    return max(MIN_GAIN, 2.0 * math.sqrt(2.0) * own_spread)


def make_baseline(windows: list[Window], tol: float) -> Baseline:
    """The baseline from every baseline window that ran: their mean rate, with the drift between them
    (half their range) counted as uncertainty; losses are reproducible when every window's agree."""
    ok = [w for w in windows if w.ok]
    assert ok and ok[0].real_tokens_per_s is not None, "the first baseline window ran"
    rates = [w.real_tokens_per_s or 0.0 for w in ok]
    rate = sum(rates) / len(rates)
    drift = (max(rates) - min(rates)) / 2 / rate if len(rates) > 1 else 0.0
    errors = [w.spread or 0.0 for w in ok]
    spread = math.sqrt(sum(e * e for e in errors) / len(errors) + drift * drift)
    reproducible = None
    with_losses = [w for w in ok if w.losses]
    if len(with_losses) > 1:
        reproducible = all(losses_match(with_losses[0].losses, w.losses, tol)[0] for w in with_losses[1:])
    end = rates[-1] if len(rates) > 1 else None
    own = math.sqrt(sum(e * e for e in errors) / len(errors))
    disagreement = (max(rates) - min(rates)) / rate if len(rates) > 1 else None
    return Baseline(rate, spread, rates[0], end, ok[0].losses, reproducible, len(rates), disagreement, own)


def losses_match(a: list[float], b: list[float], rtol: float) -> tuple[bool, float]:
    """Whether the first losses agree, and the largest relative difference."""
    n = min(len(a), len(b))
    if n == 0:
        return False, math.inf
    worst = max(abs(x - y) / max(abs(x), 1e-8) for x, y in zip(a[:n], b[:n], strict=True))
    return worst <= rtol, worst


@dataclass
class Verdict:
    fix: str
    title: str
    preserves_computation: bool
    why_tried: str
    real_tokens_per_s: float | None
    speedup: float | None
    spread: float | None  # uncertainty of the speed-up, relative
    kept: bool
    reason: str
    applied: str | None
    loss_max_rel_diff: float | None = None
    status: str = ""  # one or two words for the table: kept, within noise, slower, not applicable, failed…
    window_spread: float | None = None  # the window's own relative standard error, without the baseline's
    applied_params: dict[str, object] = field(default_factory=dict)  # what the remedy's advice needs
    cause: CauseId | None = None  # the finding that proposed it
    predicted: float | None = None  # the speed-up that finding estimated (what calibration checks)

    def to_dict(self) -> dict[str, object]:
        return {
            "fix": self.fix,
            "title": self.title,
            "preserves_computation": self.preserves_computation,
            "why_tried": self.why_tried,
            "real_tokens_per_s": self.real_tokens_per_s,
            "speedup": self.speedup,
            "spread": self.spread,
            "window_spread": self.window_spread,
            "kept": self.kept,
            "status": self.status,
            "reason": self.reason,
            "applied": self.applied,
            "loss_max_rel_diff": self.loss_max_rel_diff,
            "applied_params": self.applied_params,
            "cause": self.cause,
            "predicted": self.predicted,
        }


def judge(candidate: Remedy, why: str, window: Window, base: Baseline, tol: float) -> Verdict:
    fix = str(candidate.id)
    verdict = Verdict(
        fix,
        candidate.title,
        candidate.preserves_computation,
        why,
        None,
        None,
        None,
        False,
        "",
        window.applied.get(fix),
        applied_params=dict(window.applied_params.get(fix, {})),
    )
    if not window.ok:
        verdict.status = "out of memory" if (window.error or "").startswith("out of memory") else "failed"
        verdict.reason = f"{window.error}"
        return verdict
    if fix in window.revoked:
        verdict.status = "not applied"
        verdict.reason = window.revoked[fix]
        return verdict
    if fix not in window.applied:
        verdict.status = "not applicable"
        verdict.reason = window.skipped.get(fix, "nothing in the job to apply it to")
        return verdict
    if window.rate_of == "steps" and candidate.changes_batch_shape:
        verdict.status = "not comparable"
        verdict.reason = (
            "the job's tokens and rows are unknown, so windows compare on steps/s, which holds only for the same "
            "batch shape; this fix changes it"
        )
        return verdict
    rate = window.real_tokens_per_s
    assert rate is not None
    verdict.real_tokens_per_s = rate
    verdict.window_spread = window.spread
    verdict.speedup = rate / base.real_tokens_per_s
    verdict.spread = math.sqrt((window.spread or 0.0) ** 2 + base.spread**2)
    if window.losses and base.losses:
        same, worst = losses_match(base.losses, window.losses, tol)
        verdict.loss_max_rel_diff = worst
        if candidate.preserves_computation and base.losses_reproducible is not False and not same:
            verdict.status = "changed the losses"
            verdict.reason = (
                f"changed the first losses by up to {worst:.1e} (relative) although it should preserve them"
            )
            return verdict
    gain = verdict.speedup - 1.0
    needed = max(MIN_GAIN, 2.0 * verdict.spread)
    if gain <= needed:
        verdict.status = "within noise" if gain > -needed else "slower"
        verdict.reason = f"{gain:+.1%}; a fix is kept above +{needed:.1%} (3% or twice the uncertainty)"
        if verdict.status == "within noise" and base.noisy:
            undecided(verdict, base)
        return verdict
    verdict.kept = True
    verdict.status = "kept"
    verdict.reason = f"{gain:+.1%}, more than twice its uncertainty (±{verdict.spread:.1%})"
    return verdict


def undecided(verdict: Verdict, base: Baseline) -> None:
    """A fix within the noise of a noisy machine: the baselines around it moved more than the run resolves,
    so its window neither shows a gain nor rules one out."""
    assert base.disagreement is not None
    gain = (verdict.speedup or 1.0) - 1.0
    verdict.status = UNDECIDED
    verdict.reason = (
        f"{gain:+.1%}, but the baseline windows around it disagreed by {base.disagreement:.0%}, more than the "
        f"{base.resolvable:.0%} this run resolves: the machine was too noisy to tell whether it helps"
    )
