"""The tune loop: baseline, each candidate alone, baseline again (drift), then the kept fixes together.

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
    BASELINE_EVERY,
    BASELINE_PRECISION,
    BudgetPlan,
    bracketing,
    budget_plan,
    candidate_precision,
)
from pitstop.tune.conclusion import Undecided, undecided
from pitstop.tune.proposals import Change, Proposal, exclusive, kept_change, propose
from pitstop.tune.verdict import (
    LOSS_RTOL,
    LOSS_RTOL_GPU,
    MIN_GAIN,
    UNDECIDED,
    Baseline,
    Verdict,
    judge,
    losses_match,
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "fixes": self.fixes,
            "real_tokens_per_s": self.real_tokens_per_s,
            "speedup": self.speedup,
            "spread": self.spread,
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
                "rate_of": self.baseline_window.rate_of,  # what its rate counts: real tokens, tokens, …, steps
                "counted_from": counted_from(self.baseline_window),
            },
            "candidates": [v.to_dict() for v in self.verdicts],
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
    if baseline.losses_reproducible is False:
        notes.append(
            "the job's first losses differ between two identical runs (unseeded?): losses were not compared"
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
        window = run_window(
            self.command,
            request,
            self.options.steps or FIXED_STEPS,
            self.options.warmup,
            timeout,
            self.progress.step,
            rule,
        )
        for line in window.redirected:
            if line not in self.redirected:
                self.redirected.append(line)
        self.progress.done(label, window)
        return window

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
        scout = self.run("diagnosis (baseline)", precision=BASELINE_PRECISION)
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
        proposals = [p for p in proposals if p not in unfit]
        plan = self._plan(proposals, scout)
        self.total = 2 + len(plan.tried) + len(plan.tried) // BASELINE_EVERY
        baselines: list[tuple[int, Window]] = [(0, scout)]  # (position among the windows, window)
        windows: list[tuple[Proposal, Window, int]] = []
        not_tried = [
            (str(p.fix), "it changes the batch shape, and this job's windows compare on steps/s")
            for p in unfit
        ]
        for proposal in proposals:
            # a candidate before a closing baseline: drift is measured only with what is left
            if self.left_s() < self.window_s:
                not_tried.append((str(proposal.fix), "the time budget ran out"))
                continue
            position = len(windows) + len(baselines)
            window = self.run(
                str(proposal.fix), (str(proposal.fix),), precision=candidate_precision(proposal)
            )
            windows.append((proposal, window, position))
            more = len(windows) < len(proposals)
            if len(windows) % BASELINE_EVERY == 0 and more and self.left_s() > self.window_s * 3:
                baselines.append((position + 1, self.run("baseline", precision=BASELINE_PRECISION)))
        if self.left_s() > self.window_s:
            baselines.append(
                (len(windows) + len(baselines), self.run("baseline again", precision=BASELINE_PRECISION))
            )
        baseline = make_baseline([w for _, w in baselines], tol)
        verdicts = [
            judge(p.remedy, p.why, w, bracketing(baselines, position, baseline, tol), tol)
            for p, w, position in windows
        ]
        for (proposal, _, _), verdict in zip(windows, verdicts, strict=True):
            verdict.cause, verdict.predicted = proposal.cause, proposal.expected
        best = self._best(verdicts, baseline, env.framework)
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
        )
        result.notes += self.combination_notes + rate_notes(scout) + baseline_notes(baseline, noise)
        return result

    def _plan(self, proposals: list[Proposal], scout: Window) -> BudgetPlan:
        """What the budget covers at this job's window length, said before the first candidate runs."""
        plan = budget_plan(proposals, scout, self.left_s())
        note = getattr(self.progress, "note", None)
        if callable(note):
            note(plan.text)
        return plan

    def _best(self, verdicts: list[Verdict], baseline: Baseline, framework: str | None) -> Best | None:
        """Greedy, from the fastest kept fix: add the next candidate while the combination measurably beats
        the one before. Fixes too small to show alone are tried on top too (once a larger cost is gone,
        theirs is a larger share of the step), and so are those whose gain needs another fix first.
        Every accepted combination has been measured as a whole."""
        kept = sorted((v for v in verdicts if v.kept), key=lambda v: -(v.speedup or 0.0))
        if not kept:
            return None
        first = kept[0]
        fixes = [first.fix]
        rate, spread = first.real_tokens_per_s or 0.0, first.window_spread or 0.0
        # the speed-up is chained: the best fix's against the baseline, times each accepted step's gain
        # over the window right before it, so drift between distant windows does not enter
        speedup, variance = first.speedup or 1.0, (first.spread or 0.0) ** 2
        maybe = sorted(
            (
                v
                for v in verdicts
                if v.status in ("within noise", UNDECIDED)
                or (v.status == "slower" and remedy(v.fix).helps_with)
            ),
            key=lambda v: -(v.speedup or 0.0),
        )
        details: dict[str, dict[str, Any]] = {v.fix: dict(v.applied_params) for v in verdicts}
        remeasured = False
        for v in kept[1:] + maybe:
            candidate = remedy(v.fix)
            if any(exclusive(v.fix, other) for other in fixes):
                continue
            if candidate.helps_with and not any(h in fixes for h in candidate.helps_with):
                continue
            if not remeasured and self.left_s() > self.window_s * 3:
                # the best fix again, right before what it is compared with: the machine drifts
                again = self.run(f"{first.fix} again", (first.fix,))
                if again.ok and again.real_tokens_per_s:
                    rate, spread = again.real_tokens_per_s, again.spread or 0.0
                remeasured = True
            if self.left_s() < self.window_s * 1.5:
                self.combination_notes.append(f"{v.fix} not tried together with {' + '.join(fixes)}: budget")
                continue
            together = (*fixes, v.fix)
            trial = self.run(" + ".join(together), together)
            problem = self._combination_problem(trial, together, baseline)
            if problem:
                self.combination_notes.append(f"adding {v.fix} to {' + '.join(fixes)}: {problem}, left out")
                continue
            gain = (trial.real_tokens_per_s or 0.0) / rate - 1.0 if trial.ok else None
            uncertainty = ((trial.spread or 0.0) ** 2 + spread**2) ** 0.5
            if gain is None or gain <= max(MIN_GAIN, 2.0 * uncertainty):
                outcome = trial.error if gain is None else f"{gain:+.1%}"
                self.combination_notes.append(f"adding {v.fix} to {' + '.join(fixes)}: {outcome}, left out")
                continue
            fixes.append(v.fix)
            speedup *= 1.0 + gain
            variance += uncertainty**2
            rate = trial.real_tokens_per_s or rate
            spread = trial.spread or 0.0
            details.update(trial.applied_params)
        target = flash_or_sdpa(self.attn_target, tuple(fixes))
        changes = [kept_change(f, framework, self._kept_params(f, details.get(f), target)) for f in fixes]
        best_rate = baseline.real_tokens_per_s * speedup
        return Best(fixes, best_rate, speedup, variance**0.5, changes, True)

    def _kept_params(self, fix: str, params: dict[str, Any] | None, attention: str) -> dict[str, Any]:
        """What the kept change's advice is written with: the trial's own parameters, and for attention
        the implementation that was measured."""
        kept = dict(params or {})
        if fix == RemedyId.ATTENTION:
            kept.update(target=attention, hf_model=True)
        return kept

    def _combination_problem(self, trial: Window, fixes: tuple[str, ...], baseline: Baseline) -> str | None:
        """Why a combination's window cannot count: a fix that did not apply in it, or losses changed by
        fixes that each should have preserved them."""
        if not trial.ok:
            return None  # its error is reported with the gain check
        missing = [f for f in fixes if f not in trial.applied]
        if missing:
            return f"{', '.join(missing)} did not apply together with the others"
        preserving = all(remedy(f).preserves_computation for f in fixes)
        if preserving and baseline.losses_reproducible is not False and trial.losses and baseline.losses:
            same, worst = losses_match(baseline.losses, trial.losses, self.tol)
            if not same:
                return f"together they changed the first losses by up to {worst:.1e}"
        return None


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
