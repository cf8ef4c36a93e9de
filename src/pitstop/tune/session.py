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

from pitstop.fixes.request import FixRequest
from pitstop.tune.candidates import CANDIDATES, Proposal, exclusive, propose
from pitstop.tune.changes import Change, change_for
from pitstop.tune.verdict import (
    LOSS_RTOL,
    LOSS_RTOL_GPU,
    MIN_GAIN,
    Baseline,
    Verdict,
    judge,
    make_baseline,
)
from pitstop.tune.window import Window, run_window

SCHEMA_TUNE = "pitstop.tune/1"
LOSS_STEPS = 3


class TuneError(Exception):
    """The job cannot be tuned (its baseline window did not run)."""


class Progress(Protocol):
    def window(self, label: str, index: int, total: int) -> None: ...
    def step(self, step: int) -> None: ...
    def done(self, label: str, window: Window) -> None: ...


@dataclass
class TuneOptions:
    steps: int = 30
    warmup: int = 5
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

    def to_dict(self) -> dict[str, Any]:
        from pitstop import __version__

        b = self.baseline
        assert self.baseline_window.diagnosis is not None
        return {
            "schema": SCHEMA_TUNE,
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
            },
            "candidates": [v.to_dict() for v in self.verdicts],
            "not_tried": [{"fix": f, "reason": r} for f, r in self.not_tried],
            "best": None if self.best is None else self.best.to_dict(),
            "redirected_outputs": self.redirected,
            "notes": self.notes,
            "baseline_run": self.baseline_window.diagnosis.to_dict(),
        }


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

    def left_s(self) -> float:
        return self.options.budget_s - (time.monotonic() - self.started)

    def run(self, label: str, fixes: tuple[str, ...] = ()) -> Window:
        self.index += 1
        self.total = max(self.total, self.index)
        self.progress.window(label, self.index, self.total)
        request = FixRequest(
            fixes=frozenset(fixes),
            attn=self.attn,
            attn_target=self.attn_target,
            scratch=self.scratch,
            loss_steps=LOSS_STEPS,
        )
        # a window may take three times the baseline's before it is stopped (and never past the budget)
        timeout = max(60.0, 3 * self.window_s) if self.window_s else max(self.left_s(), 60.0)
        window = run_window(
            self.command, request, self.options.steps, self.options.warmup, timeout, self.progress.step
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
        self.total = 3
        # the first window diagnoses the job (and warms the machine: a fresh one runs its first process
        # slower); the baseline the fixes are compared with is measured after it, and again at the end
        scout = self.run("diagnosis")
        if not scout.ok or scout.diagnosis is None:
            raise TuneError(f"the job's first window did not run: {scout.error}")
        self.window_s = scout.seconds
        diagnosis = scout.diagnosis
        env = diagnosis.profile.environment
        self.attn = env.attn_implementation
        self.attn_target = attention_target(env.on_gpu)
        tol = LOSS_RTOL_GPU if env.on_gpu else LOSS_RTOL
        proposals = propose(diagnosis, opts.also, opts.only, opts.skip)
        self.total = 3 + len(proposals)
        first = self.run("baseline")
        if not first.ok:
            first = scout
        windows: list[tuple[Proposal, Window]] = []
        not_tried: list[tuple[str, str]] = []
        for proposal in proposals:
            # keep room for the closing baseline and the final check
            if self.left_s() < self.window_s * 3:
                not_tried.append((proposal.candidate.fix, "the time budget ran out"))
                continue
            windows.append((proposal, self.run(proposal.candidate.fix, (proposal.candidate.fix,))))
        last = self.run("baseline again") if self.left_s() > self.window_s else None
        baseline = make_baseline(first, last, tol)
        verdicts = [judge(p.candidate, p.why, w, baseline, tol) for p, w in windows]
        best = self._best(verdicts, baseline, env.framework)
        result = TuneResult(
            command=self.command,
            baseline=baseline,
            baseline_window=first if first.diagnosis is not None else scout,
            verdicts=verdicts,
            best=best,
            not_tried=not_tried,
            framework=env.framework,
            seconds=time.monotonic() - self.started,
            budget_s=opts.budget_s,
            redirected=self.redirected,
        )
        result.notes += self.combination_notes
        if baseline.losses_reproducible is False:
            result.notes.append(
                "the job's first losses differ between two identical runs (unseeded?): losses were not compared"
            )
        if baseline.drift is not None and abs(baseline.drift) > 0.05:
            result.notes.append(
                f"the baseline drifted {baseline.drift:+.1%} during tuning: the machine is noisy"
            )
        return result

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
        maybe = sorted(
            (
                v
                for v in verdicts
                if v.status == "within noise" or (v.status == "slower" and CANDIDATES[v.fix].helps_with)
            ),
            key=lambda v: -(v.speedup or 0.0),
        )
        details = {v.fix: v.applied for v in verdicts}
        remeasured = False
        for v in kept[1:] + maybe:
            candidate = CANDIDATES[v.fix]
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
            trial = self.run(" + ".join([*fixes, v.fix]), (*fixes, v.fix))
            gain = (trial.real_tokens_per_s or 0.0) / rate - 1.0 if trial.ok else None
            uncertainty = ((trial.spread or 0.0) ** 2 + spread**2) ** 0.5
            if gain is None or gain <= max(MIN_GAIN, 2.0 * uncertainty):
                outcome = trial.error if gain is None else f"{gain:+.1%}"
                self.combination_notes.append(f"adding {v.fix} to {' + '.join(fixes)}: {outcome}, left out")
                continue
            fixes.append(v.fix)
            rate = trial.real_tokens_per_s or rate
            spread = trial.spread or 0.0
            details.update(trial.applied)
        changes = [change_for(f, framework, details.get(f), self.attn_target) for f in fixes]
        total_spread = (spread**2 + baseline.spread**2) ** 0.5
        return Best(fixes, rate, rate / baseline.real_tokens_per_s, total_spread, changes, True)


def attention_target(on_gpu: bool) -> str:
    """FlashAttention 2 where it is installed and the job runs on a GPU; SDPA otherwise."""
    if on_gpu:
        import importlib.util

        if importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
    return "sdpa"


def tune(command: list[str], options: TuneOptions, progress: Progress) -> TuneResult:
    return Session(command, options, progress).tune()
