"""The tune loop: the baseline, the first fix, the baseline again (A/B/A: whether the job repeats its own
first losses and speed), then one fix per cause before any second variant, a baseline after every
``BASELINE_EVERY`` fixes, the kept fixes together last and a closing baseline.

Every window is the user's own command, unchanged, with fixes applied from outside by the trial process.
Time is bounded: a window that would not fit in what is left of the budget is not started.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pitstop import schemas
from pitstop.core.profile import CountSource
from pitstop.core.vocabulary import RemedyId
from pitstop.display import html_of
from pitstop.errors import PitstopError
from pitstop.probe.stopping import WindowRule
from pitstop.remedies import remedy
from pitstop.trials.request import FixRequest
from pitstop.tune.budget import (
    BASELINE_PRECISION,
    BudgetPlan,
    baseline_due,
    baselines_after,
    bracketing,
    budget_plan,
    candidate_precision,
)
from pitstop.tune.conclusion import Undecided, undecided
from pitstop.tune.proposals import (
    Change,
    Proposal,
    by_cause_first,
    exclusive,
    is_variant,
    kept_change,
    propose,
)
from pitstop.tune.verdict import (
    LOSS_RTOL,
    LOSS_RTOL_GPU,
    LOSS_SPREAD_FACTOR,
    SINGLE_POINT,
    Baseline,
    Combined,
    Verdict,
    judge,
    judge_combined,
    make_baseline,
)
from pitstop.tune.window import Window, run_window
from pitstop.version import __version__

LOSS_STEPS = 3
FIXED_STEPS = 30  # the window of a job of several ranks, which cannot end windows by precision


class TuneError(PitstopError):
    """The job cannot be tuned (its baseline window did not run)."""


class Progress(Protocol):
    def window(self, label: str, index: int, total: int) -> None: ...
    def step(self, step: int) -> None: ...
    def done(self, label: str, window: Window) -> None: ...


@dataclass
class TuneOptions:
    steps: int | None = None  # None: each window as long as its precision needs (``WindowRule``)
    warmup: int = 5  # with fixed ``steps``
    budget_s: float = 600.0
    also: list[str] = field(default_factory=list)
    only: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)
    keep_outputs: bool = False


@dataclass
class Best:
    fixes: list[str]
    real_tokens_per_s: float
    speedup: float
    spread: float | None
    changes: list[Change]
    verified: bool  # measured as a whole (every fix of it together, in one window)
    gain_basis: str | None = None  # the baselines its speed-up is against (verdict.BRACKETED, SINGLE_POINT)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fixes": self.fixes,
            "real_tokens_per_s": self.real_tokens_per_s,
            "speedup": self.speedup,
            "spread": self.spread,
            "gain_basis": self.gain_basis,
            "verified": self.verified,
            "changes": [{"fix": c.fix, "text": c.text, "snippet": c.snippet} for c in self.changes],
        }


def counted_from(window: Window) -> str | None:
    """Where the window's rows and tokens were counted (the lowest rank's word for it)."""
    diagnosis = window.diagnosis
    ranks = diagnosis.profile.ranks if diagnosis is not None else []
    return ranks[0].tokens_counted_from if ranks else None


def rate_notes(scout: Window) -> list[str]:
    """What the windows' rate counts, when it is not real tokens from the DataLoader's batches."""
    notes = []
    if counted_from(scout) == CountSource.MODEL_INPUTS:
        notes.append(
            "the job hands its model batches without a DataLoader: tokens were counted from the model's inputs"
        )
    if scout.rate_of == "steps":
        notes.append(
            "the job's tokens and rows are unknown: windows were compared on steps/s with the same batch shape; "
            "fixes that change the batch shape were not judged"
        )
    elif scout.rate_of != "real tokens":
        notes.append(f"the job's real tokens are unknown: windows were compared on {scout.rate_of}/s")
    return notes


@dataclass
class TuneResult:
    command: list[str]
    baseline: Baseline
    baseline_window: Window
    verdicts: list[Verdict]
    best: Best | None
    not_tried: list[tuple[str, str]]  # (fix, why)
    framework: str | None
    seconds: float
    budget_s: float
    redirected: list[str]
    notes: list[str] = field(default_factory=list)
    plan: str = ""  # what the budget was planned to cover, said after the first window
    undecided: Undecided | None = None  # fixes a noisy machine left undecided, and what a rerun needs
    combined: Combined | None = None  # the kept fixes measured together, when two or more were kept
    sequence: list[dict[str, Any]] = field(default_factory=list)  # every window, in the order it ran

    def _repr_html_(self) -> str | None:
        """In a notebook, a tune result shows itself as the HTML report."""
        return html_of(self)

    def to_dict(self) -> dict[str, Any]:
        b = self.baseline
        assert self.baseline_window.diagnosis is not None
        return {
            "schema": schemas.TUNE,
            "pitstop_version": __version__,
            "command": self.command,
            "framework": self.framework,
            "budget_s": self.budget_s,
            "elapsed_s": round(self.seconds, 1),
            "baseline": {
                "real_tokens_per_s": b.real_tokens_per_s,
                "spread": b.spread,
                "start": b.start,
                "end": b.end,
                "drift": b.drift,
                "losses": b.losses,
                "losses_reproducible": b.losses_reproducible,
                "losses_spread": b.losses_spread,  # largest relative difference between baseline runs
                "windows": b.windows,
                "rate_of": self.baseline_window.rate_of,  # what its rate counts: real tokens, tokens, …, steps
                "counted_from": counted_from(self.baseline_window),
            },
            "candidates": [v.to_dict() for v in self.verdicts],
            "combined": None if self.combined is None else self.combined.to_dict(),
            "baseline_repeats": [w for w in self.sequence if w["kind"] == "baseline"],
            "windows": self.sequence,
            "not_tried": [{"fix": f, "reason": r} for f, r in self.not_tried],
            "best": None if self.best is None else self.best.to_dict(),
            "redirected_outputs": self.redirected,
            "notes": self.notes,
            "plan": self.plan,
            "undecided": None if self.undecided is None else self.undecided.to_dict(),
            "predicted_vs_measured": predicted_vs_measured(self.verdicts),
            "baseline_run": self.baseline_window.diagnosis.to_dict(),
        }


def predicted_vs_measured(verdicts: list[Verdict]) -> list[dict[str, Any]]:
    """Each measured fix with the speed-up its finding predicted: what the history keeps to calibrate the
    rules on this user's own jobs (issue 27, item 3). Undecided and unmeasured fixes are left out."""
    return [
        {
            "cause": v.cause,
            "fix": v.fix,
            "predicted": v.predicted,
            "measured": v.speedup,
            "spread": v.spread,
            "status": v.status,
            "gain_basis": v.gain_basis,
        }
        for v in verdicts
        if v.cause and v.predicted and v.speedup and v.status in ("kept", "within noise", "slower")
    ]


def baseline_notes(baseline: Baseline, noise: Undecided | None) -> list[str]:
    """What the baseline windows say about the whole result: losses unread or unreproducible, drift, and the
    fixes a noisy machine left undecided."""
    notes: list[str] = []
    if not baseline.losses:
        notes.append("the job's losses could not be read: fixes meant to preserve them were not checked")
    if baseline.losses_reproducible is False and baseline.losses_spread is not None:
        notes.append(
            f"the job's first losses differ between two identical baseline runs by up to "
            f"{baseline.losses_spread:.1e} (not seeded before the model is built?): tune did not seed it; a fix "
            "meant to preserve the computation was judged against that spread (up to "
            f"{LOSS_SPREAD_FACTOR:.0f}× it is the job's own variation, not the fix's doing)"
        )
    elif baseline.losses_reproducible is None and baseline.losses:
        notes.append(
            "the baseline ran once: whether the job repeats its own first losses is unknown, so no fix was "
            "blamed for changing them"
        )
    if baseline.drift is not None and abs(baseline.drift) > 0.05:
        notes.append(
            f"the baseline drifted {baseline.drift:+.1%} during tuning: the machine is noisy; each fix was "
            "compared with the baselines measured before and after it"
        )
    if noise is not None:
        notes.append(noise.text())
    return notes


class Session:
    def __init__(self, command: list[str], options: TuneOptions, progress: Progress) -> None:
        self.command = command
        self.options = options
        self.progress = progress
        self.started = time.monotonic()
        self.scratch: Path | None = None
        self.redirected: list[str] = []
        self.attn: str | None = None
        self.attn_target = "sdpa"
        self.window_s = 0.0
        self.index = 0
        self.total = 0
        self.combination_notes: list[str] = []
        self.tol = LOSS_RTOL
        self.baselines_run = 0
        self.baselines_planned = 2  # the job's repeatability needs two, with a trial between them
        self.sequence: list[dict[str, Any]] = []  # every window in the order it ran: what the JSON shows

    def left_s(self) -> float:
        return self.options.budget_s - (time.monotonic() - self.started)

    def run(self, label: str, fixes: tuple[str, ...] = (), precision: float = BASELINE_PRECISION) -> Window:
        self.index += 1
        self.total = max(self.total, self.index)
        self.progress.window(label, self.index, self.total)
        request = FixRequest(
            fixes=frozenset(fixes),
            attn=self.attn,
            attn_target=flash_or_sdpa(self.attn_target, fixes),
            # each window its own: a job that resumes from its last checkpoint must not resume another trial's
            scratch=None if self.scratch is None else self.scratch / f"window-{self.index}",
            loss_steps=LOSS_STEPS,
        )
        # a window may take three times the baseline's before it is stopped, and never runs past the budget
        timeout = max(60.0, 3 * self.window_s) if self.window_s else max(self.left_s(), 60.0)
        timeout = max(min(timeout, self.left_s()), 30.0)
        rule = None
        if self.options.steps is None:  # the window ends when its step time is precise enough
            longest = min(timeout * 0.8, max(self.options.budget_s / 6, 10.0))
            rule = WindowRule(precision=precision, max_seconds=longest, max_warmup_seconds=longest / 2)
        waiting = getattr(self.progress, "waiting", None)
        window = run_window(
            self.command,
            request,
            self.options.steps or FIXED_STEPS,
            self.options.warmup,
            timeout,
            self.progress.step,
            rule,
            waiting if callable(waiting) else None,
        )
        for line in window.redirected:
            if line not in self.redirected:
                self.redirected.append(line)
        self.progress.done(label, window)
        self.sequence.append(
            {
                "position": len(self.sequence),
                "kind": "baseline" if not fixes else "trial",
                "fixes": list(fixes),
                "label": label,
                "real_tokens_per_s": window.real_tokens_per_s,
                "spread": window.spread,
                "first_losses": window.losses,
                "seconds": round(window.seconds, 1),
                "error": window.error,
            }
        )
        return window

    def baseline(self, scout: bool = False) -> Window:
        """The job as it is, once more: ``measuring the baseline (2 of 3)``."""
        self.baselines_run += 1
        self.baselines_planned = max(self.baselines_planned, self.baselines_run)
        label = f"measuring the baseline ({self.baselines_run} of {self.baselines_planned})"
        return self.run(label + (" and diagnosing the job" if scout else ""), precision=BASELINE_PRECISION)

    def tune(self) -> TuneResult:
        opts = self.options
        if not opts.keep_outputs:
            self.scratch = Path(tempfile.mkdtemp(prefix="pitstop-tune-scratch-"))
        try:
            return self._tune(opts)
        finally:
            if self.scratch is not None:
                shutil.rmtree(self.scratch, ignore_errors=True)

    def _tune(self, opts: TuneOptions) -> TuneResult:
        self.total = 2
        # the first window diagnoses the job and is the first baseline too: nothing differs between them
        scout = self.baseline(scout=True)
        if not scout.ok or scout.diagnosis is None:
            raise TuneError(f"the job's first window did not run: {scout.error}")
        self.window_s = scout.seconds
        diagnosis = scout.diagnosis
        env = diagnosis.profile.environment
        self.attn = env.attn_implementation
        self.attn_target = attention_target(env.on_gpu, env.param_dtype, env.autocast_dtype)
        tol = self.tol = LOSS_RTOL_GPU if env.on_gpu else LOSS_RTOL
        proposals = propose(diagnosis, opts.also, opts.only, opts.skip)
        # steps/s (a job whose tokens and rows are unknown) compares only windows of the same batch shape
        unfit = [p for p in proposals if scout.rate_of == "steps" and p.remedy.changes_batch_shape]
        proposals = by_cause_first([p for p in proposals if p not in unfit])
        plan = self._plan(proposals, scout)
        self.baselines_planned = max(2, 1 + baselines_after(len(plan.tried)))
        self.total = len(plan.tried) + self.baselines_planned
        baselines: list[tuple[int, Window]] = [(0, scout)]  # (position among the windows, window)
        windows: list[tuple[Proposal, Window, int]] = []
        not_tried = [
            (str(p.fix), "it changes the batch shape, and this job's windows compare on steps/s")
            for p in unfit
        ]
        self._trials(proposals, baselines, windows, not_tried, tol)
        verdicts = self._judge(windows, baselines, tol)
        combined = self._together(verdicts, baselines, tol)
        if self.sequence[-1]["kind"] != "baseline" and self.left_s() > self.window_s:
            baselines.append((len(self.sequence), self.baseline()))  # the closing baseline
        baseline = make_baseline([w for _, w in baselines], tol)
        verdicts = self._judge(windows, baselines, tol)
        combined_verdict = None
        if combined is not None:
            window, position = combined
            fixes = list(window.fixes)
            ordered = [v.fix for v in sorted(verdicts, key=lambda v: -(v.speedup or 0.0)) if v.fix in fixes]
            best_alone = next(v for v in verdicts if v.fix == ordered[0])
            preserving = all(remedy(f).preserves_computation for f in fixes)
            near = bracketing(baselines, position, baseline, tol)
            combined_verdict = judge_combined(ordered, preserving, window, near, tol, best_alone)
        best = self._best(verdicts, combined_verdict, baseline, env.framework)
        rates = [w.real_tokens_per_s for _, w in baselines if w.ok and w.real_tokens_per_s]
        noise = undecided(verdicts, baseline, rates, self.window_s, scout.seconds)
        result = TuneResult(
            command=self.command,
            baseline=baseline,
            baseline_window=scout,
            verdicts=verdicts,
            best=best,
            not_tried=not_tried,
            framework=env.framework,
            seconds=time.monotonic() - self.started,
            budget_s=opts.budget_s,
            redirected=self.redirected,
            plan=plan.text,
            undecided=noise,
            combined=combined_verdict,
            sequence=self.sequence,
        )
        result.notes += self.combination_notes + rate_notes(scout) + baseline_notes(baseline, noise)
        result.notes += basis_notes(verdicts, baseline)
        return result

    def _trials(
        self,
        proposals: list[Proposal],
        baselines: list[tuple[int, Window]],
        windows: list[tuple[Proposal, Window, int]],
        not_tried: list[tuple[str, str]],
        tol: float,
    ) -> None:
        """Each fix alone, in ``by_cause_first`` order, with the baselines between them."""
        for proposal in proposals:
            # a second variant of a cause leaves room for the kept fixes together (and a baseline after them)
            together = is_variant(proposal, [p for p, _, _ in windows]) and self._combination(
                self._judge(windows, baselines, tol)
            )
            reserve = 2 * self.window_s if together else 0.0
            if self.left_s() < self.window_s + reserve:
                why = "the time budget ran out" + (
                    " (what was left tried the kept fixes together)" if together else ""
                )
                not_tried.append((str(proposal.fix), why))
                continue
            label = f"trying {proposal.fix} " + (
                f"(cause {proposal.cause})" if proposal.cause else f"({proposal.why})"
            )
            window = self.run(label, (str(proposal.fix),), precision=candidate_precision(proposal))
            windows.append((proposal, window, len(self.sequence) - 1))
            # right after the first trial (A/B/A: does the job repeat its own losses and speed?), then every
            # BASELINE_EVERY trials: each fix meets a baseline on both sides
            if baseline_due(len(windows)) and self.left_s() > self.window_s:
                baselines.append((len(self.sequence), self.baseline()))

    def _judge(
        self, windows: list[tuple[Proposal, Window, int]], baselines: list[tuple[int, Window]], tol: float
    ) -> list[Verdict]:
        """Each trial against the mean of the baselines around it, those measured so far."""
        overall = make_baseline([w for _, w in baselines], tol)
        verdicts = []
        for proposal, window, position in windows:
            verdict = judge(
                proposal.remedy, proposal.why, window, bracketing(baselines, position, overall, tol), tol
            )
            verdict.cause, verdict.predicted = proposal.cause, proposal.expected
            verdicts.append(verdict)
        return verdicts

    def _combination(self, verdicts: list[Verdict]) -> list[str]:
        """The kept fixes that go together, fastest first; fewer than two: nothing to combine."""
        chosen: list[str] = []
        for v in sorted((v for v in verdicts if v.kept), key=lambda v: -(v.speedup or 0.0)):
            needs = remedy(v.fix).helps_with
            if any(exclusive(v.fix, other) for other in chosen):
                continue
            if needs and not any(h in chosen for h in needs):
                continue
            chosen.append(v.fix)
        return chosen if len(chosen) >= 2 else []

    def _together(
        self, verdicts: list[Verdict], baselines: list[tuple[int, Window]], tol: float
    ) -> tuple[Window, int] | None:
        """The best kept fixes measured together in one window, last, with a baseline before it (the last
        window, when that was one, or a new one)."""
        fixes = self._combination(verdicts)
        if not fixes:
            return None
        if self.left_s() < self.window_s:
            self.combination_notes.append(f"{' + '.join(fixes)} not tried together: the time budget ran out")
            return None
        window = self.run(f"trying {' + '.join(fixes)} together", tuple(fixes))
        return window, len(self.sequence) - 1

    def _plan(self, proposals: list[Proposal], scout: Window) -> BudgetPlan:
        """What the budget covers at this job's window length, said before the first candidate runs."""
        plan = budget_plan(proposals, scout, self.left_s())
        note = getattr(self.progress, "note", None)
        if callable(note):
            note(plan.text)
        return plan

    def _best(
        self, verdicts: list[Verdict], combined: Combined | None, baseline: Baseline, framework: str | None
    ) -> Best | None:
        """The kept fixes measured together when that window beat the fastest one alone; else that one."""
        kept = sorted((v for v in verdicts if v.kept), key=lambda v: -(v.speedup or 0.0))
        if not kept:
            return None
        first = kept[0]
        details: dict[str, dict[str, Any]] = {v.fix: dict(v.applied_params) for v in verdicts}
        if combined is not None and combined.kept and combined.speedup:
            fixes, speedup, spread, basis = (
                combined.fixes,
                combined.speedup,
                combined.spread,
                combined.gain_basis,
            )
            details.update(combined.applied_params)
        else:
            if combined is not None:
                self.combination_notes.append(
                    f"{' + '.join(combined.fixes)} together: {combined.status}: {combined.reason}; "
                    f"kept {first.fix} alone"
                )
            fixes, speedup, spread, basis = [first.fix], first.speedup or 1.0, first.spread, first.gain_basis
        target = flash_or_sdpa(self.attn_target, tuple(fixes))
        changes = [kept_change(f, framework, self._kept_params(f, details.get(f), target)) for f in fixes]
        return Best(fixes, baseline.real_tokens_per_s * speedup, speedup, spread, changes, True, basis)

    def _kept_params(self, fix: str, params: dict[str, Any] | None, attention: str) -> dict[str, Any]:
        """What the kept change's advice is written with: the trial's own parameters, and for attention
        the implementation that was measured."""
        kept = dict(params or {})
        if fix == RemedyId.ATTENTION:
            kept.update(target=attention, hf_model=True)
        return kept


def basis_notes(verdicts: list[Verdict], baseline: Baseline) -> list[str]:
    """Which gains rest on one baseline point (the budget ran out before the baseline was measured again)."""
    single = [v.fix for v in verdicts if v.gain_basis == SINGLE_POINT]
    if not single:
        return []
    drift = baseline.disagreement
    widened_by = f"{drift:.0%}, the baselines' own disagreement" if drift is not None else "an assumed 10%"
    return [
        f"{', '.join(single)}: the gain is against a single baseline point (the budget ran out before the "
        f"baseline was measured again after it); its band was widened by {widened_by}"
    ]


def attention_target(on_gpu: bool, param_dtype: str | None = None, autocast_dtype: str | None = None) -> str:
    """FlashAttention 2 where it is installed and the job runs on a GPU; SDPA otherwise. FlashAttention
    takes fp16 / bf16 only: an fp32 job gets it only together with the bf16 fix (``flash_or_sdpa``)."""
    if on_gpu:
        import importlib.util

        if importlib.util.find_spec("flash_attn") is not None:
            half = {param_dtype, autocast_dtype} & {"bf16", "fp16"}
            return "flash_attention_2" if half else "flash_attention_2_with_bf16"
    return "sdpa"


def flash_or_sdpa(target: str, fixes: tuple[str, ...]) -> str:
    """The attention an fp32 job can take: FlashAttention when the bf16 fix comes with it, SDPA otherwise."""
    if target == "flash_attention_2_with_bf16":
        return "flash_attention_2" if "bf16" in fixes else "sdpa"
    return target


def tune(command: list[str], options: TuneOptions, progress: Progress) -> TuneResult:
    return Session(command, options, progress).tune()
