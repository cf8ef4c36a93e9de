"""Turning windows into decisions: speed-up against the baselines measured around each trial, with the
uncertainty of both; the loss check for fixes that should preserve the computation, held to the baseline's own
run-to-run spread when the job does not repeat itself (unseeded); kept or rejected and why."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pitstop.core.vocabulary import CauseId
from pitstop.remedies import Remedy
from pitstop.tune.window import Window

MIN_GAIN = 0.03  # below this a fix is not worth a change to the job, however sure the measurement
UNDECIDED = "undecided"  # within noise on a machine too noisy to tell: neither kept nor ruled out
# a fix meant to preserve the computation whose first losses cannot be judged on a job that does not repeat its
# own (or whose repeatability is unknown): neither kept nor rejected, and not the machine's noise either
LOSSES_UNDECIDED = "undecided (losses)"
LOSS_RTOL = 1e-3  # fp32 on CPU: kernels and summation order move losses by ~1e-6
LOSS_RTOL_GPU = 2e-2  # TF32 / reduced-precision kernels on a GPU
# A job whose first losses differ between two identical runs (no seed before the model is built) draws a new
# initialisation each run: a fix that preserves the computation draws one too, so its first losses differ from
# the baseline's by about what two baseline runs differ by. The ratio of two such differences is heavy-tailed
# (a ratio of two draws of the same size), so only ten times the baseline's own spread counts as a change
LOSS_SPREAD_FACTOR = 10.0
# two runs of a seeded job differ by float noise only (bitwise equal on a CPU, atomics on a GPU): a job whose
# baseline runs differ by more than this share of the fix tolerance does not repeat itself
REPEAT_SHARE = 0.01
# the drift assumed between a trial and a baseline measured once, when no second baseline window measured it:
# baselines minutes apart on a shared machine moved by 13-14% in the recorded runs (docs/tune.md)
UNMEASURED_DRIFT = 0.10
BRACKETED = "baselines before and after"  # gain_basis: the mean of the baseline windows around the trial


@dataclass
class Baseline:
    real_tokens_per_s: float
    spread: float  # relative uncertainty, drift between the two baseline windows included
    start: float
    end: float | None
    losses: list[float]
    losses_reproducible: bool | None  # whether the baseline windows' first losses agree to float noise
    windows: int = 1  # baseline windows that ran
    disagreement: float | None = None  # (fastest − slowest) / mean of those windows; None with one window
    own_spread: float = 0.0  # the windows' own relative standard error (rms), drift left out
    losses_spread: float | None = None  # largest relative difference of first losses between baseline windows
    loss_runs: list[list[float]] = field(default_factory=list)  # each baseline window's first losses
    basis: str = BRACKETED  # what a trial's gain against this baseline rests on (``gain_basis``)

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
    (half their range) counted as uncertainty; losses are reproducible when every window's agree, and their
    largest difference is the job's own run-to-run spread."""
    ok = [w for w in windows if w.ok]
    assert ok and ok[0].real_tokens_per_s is not None, "the first baseline window ran"
    rates = [w.real_tokens_per_s or 0.0 for w in ok]
    rate = sum(rates) / len(rates)
    drift = (max(rates) - min(rates)) / 2 / rate if len(rates) > 1 else 0.0
    errors = [w.spread or 0.0 for w in ok]
    spread = math.sqrt(sum(e * e for e in errors) / len(errors) + drift * drift)
    runs = [list(w.losses) for w in ok if w.losses]
    losses_spread = loss_spread(runs)
    reproducible = None if losses_spread is None else losses_spread <= tol * REPEAT_SHARE
    end = rates[-1] if len(rates) > 1 else None
    own = math.sqrt(sum(e * e for e in errors) / len(errors))
    disagreement = (max(rates) - min(rates)) / rate if len(rates) > 1 else None
    return Baseline(
        rate,
        spread,
        rates[0],
        end,
        ok[0].losses,
        reproducible,
        len(rates),
        disagreement,
        own,
        losses_spread,
        runs,
        BRACKETED if len(rates) > 1 else SINGLE_POINT,
    )


SINGLE_POINT = "a single baseline point"  # gain_basis: one baseline window, its band widened by the drift


def loss_spread(runs: list[list[float]]) -> float | None:
    """The largest relative difference of first losses between any two runs; None with fewer than two."""
    if len(runs) < 2:
        return None
    return max(losses_match(a, b, 0.0)[1] for i, a in enumerate(runs) for b in runs[i + 1 :])


def widened(single: Baseline, drift: float) -> Baseline:
    """A baseline of one window used for a trial it does not bracket: its band takes the ``drift`` the machine
    may have moved by between the two, since nothing re-measured it."""
    single.spread = math.sqrt(single.spread**2 + drift**2)
    single.basis = SINGLE_POINT
    return single


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
    gain_basis: str | None = None  # what the speed-up is against: BRACKETED or SINGLE_POINT
    loss_check: str | None = None  # how its first losses compared with the baseline's, in words

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
            "gain_basis": self.gain_basis,
            "loss_check": self.loss_check,
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
    verdict.gain_basis = base.basis
    if window.losses and base.losses:
        check = check_losses(window.losses, base, tol, candidate.preserves_computation)
        verdict.loss_max_rel_diff, verdict.loss_check = check.worst, check.text
        if check.status is not None:
            verdict.status, verdict.reason = check.status, check.reason
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


@dataclass(frozen=True)
class LossCheck:
    """How a window's first losses compare with the baseline's; ``status`` set when that alone decides."""

    worst: float  # relative difference to the closest baseline window's first losses
    text: str
    status: str | None = None
    reason: str = ""


def check_losses(losses: list[float], base: Baseline, tol: float, preserving: bool) -> LossCheck:
    """A fix that should preserve the computation is held to ``tol`` on a job that repeats itself; on one that
    does not (unseeded), to its own run-to-run spread; and never blamed when whether it repeats is unknown."""
    runs = base.loss_runs or [base.losses]
    worst = min(losses_match(run, losses, tol)[1] for run in runs)
    if worst <= tol:
        return LossCheck(worst, f"the baseline's (within {tol:.0e})")
    if not preserving:
        return LossCheck(worst, f"changed by up to {worst:.1e}: the fix changes what is computed")
    if base.losses_reproducible is True:
        return LossCheck(
            worst,
            f"changed by up to {worst:.1e}, though the baseline repeats its own",
            "changed the losses",
            f"changed the first losses by up to {worst:.1e} (relative) although it should preserve them",
        )
    if base.losses_reproducible is False and base.losses_spread is not None:
        allowed = max(tol, LOSS_SPREAD_FACTOR * base.losses_spread)
        if worst <= allowed:
            return LossCheck(
                worst,
                f"{worst:.1e} from the baseline's, within the job's own run-to-run spread "
                f"({base.losses_spread:.1e} between two baseline runs; an unseeded job)",
            )
        text = (
            f"{worst:.1e} from the baseline's, more than {LOSS_SPREAD_FACTOR:.0f}× the job's own run-to-run "
            f"spread ({base.losses_spread:.1e})"
        )
        return LossCheck(
            worst,
            text,
            LOSSES_UNDECIDED,
            f"its first losses are {text}: the job is not seeded, so whether the fix changes the computation "
            "cannot be told here; seed the job before it builds its model and tune again",
        )
    return LossCheck(
        worst,
        f"{worst:.1e} from the baseline's; whether the job repeats its own is unknown (one baseline run)",
        LOSSES_UNDECIDED,
        f"its first losses differ from the baseline's by {worst:.1e}, and the baseline ran once: whether the "
        "job repeats its own first losses is unknown (a larger --budget measures it again)",
    )


@dataclass
class Combined:
    """The kept fixes measured together in one window, against the baselines around it."""

    fixes: list[str]
    real_tokens_per_s: float | None
    speedup: float | None
    spread: float | None
    gain_basis: str | None
    status: str  # kept, not faster, failed, not applied, changed the losses, undecided
    reason: str
    loss_max_rel_diff: float | None = None
    loss_check: str | None = None
    applied_params: dict[str, dict[str, object]] = field(default_factory=dict)

    @property
    def kept(self) -> bool:
        return self.status == "kept"

    def to_dict(self) -> dict[str, object]:
        return {
            "fixes": self.fixes,
            "real_tokens_per_s": self.real_tokens_per_s,
            "speedup": self.speedup,
            "spread": self.spread,
            "gain_basis": self.gain_basis,
            "status": self.status,
            "kept": self.kept,
            "reason": self.reason,
            "loss_max_rel_diff": self.loss_max_rel_diff,
            "loss_check": self.loss_check,
        }


def judge_combined(
    fixes: list[str], preserving: bool, window: Window, base: Baseline, tol: float, best_single: Verdict
) -> Combined:
    """Kept when every fix applied, the losses hold where they should, it beats the baselines around it by
    the rule a single fix meets, and it is at least as fast as the best fix alone."""
    combined = Combined(
        list(fixes), None, None, None, None, "failed", "", applied_params=window.applied_params
    )
    if not window.ok or window.real_tokens_per_s is None:
        combined.reason = window.error or "nothing measured"
        return combined
    missing = [f for f in fixes if f not in window.applied]
    if missing:
        combined.status = "not applied"
        combined.reason = f"{', '.join(missing)} did not apply together with the others"
        return combined
    rate = window.real_tokens_per_s
    combined.real_tokens_per_s = rate
    combined.speedup = rate / base.real_tokens_per_s
    combined.spread = math.sqrt((window.spread or 0.0) ** 2 + base.spread**2)
    combined.gain_basis = base.basis
    if window.losses and base.losses:
        check = check_losses(window.losses, base, tol, preserving)
        combined.loss_max_rel_diff, combined.loss_check = check.worst, check.text
        if check.status is not None:
            combined.status, combined.reason = check.status, check.reason
            return combined
    gain = combined.speedup - 1.0
    needed = max(MIN_GAIN, 2.0 * combined.spread)
    alone = best_single.speedup or 1.0
    if gain <= needed:
        combined.status = "within noise" if gain > -needed else "slower"
        combined.reason = f"{gain:+.1%} together; a combination is kept above +{needed:.1%}"
    elif combined.speedup < alone:
        combined.status = "not faster"
        combined.reason = (
            f"×{combined.speedup:.2f} together, not faster than {best_single.fix} alone (×{alone:.2f})"
        )
    else:
        combined.status = "kept"
        combined.reason = (
            f"×{combined.speedup:.2f} together ±{combined.spread:.1%}, against {best_single.fix} alone "
            f"×{alone:.2f}"
        )
    return combined


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
