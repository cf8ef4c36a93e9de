"""Changes between windows: throughput down by more than the run's own noise, a new finding, a finding that
got worse. Each says the step it started at and what changed, in the doctor's terms.

The rate compared is the window's *typical* rate (tokens per step over the median step time): a rare stall
(an evaluation every 500 steps) moves a window's mean but not its median, so periodic stalls are reported as
stalls (``periodic.py``), not as changes. The noise is the run's own: the spread of the rate between the windows
since the last change and the standard error of each window's median; a change must exceed both, by a margin,
and ``min_drop``. Rates are compared as logarithms: noise is a factor, and a drop can never pass 100% (a bar
of ±92% from a spread measured in percent let an 85% drop pass as noise). A change is reported once the next
window confirms it, past three quarters of the bar (hysteresis): a drop that shows at 55% against a 50% bar and
at 48% in the next window is one lasting drop.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from pitstop.core.profile import StepRecord
from pitstop.core.vocabulary import CauseId, Phase, Severity
from pitstop.wholerun.windows import WindowSummary

SIGMAS = 4.0
CONFIRM_SHARE = 0.75  # the next window confirms a held rate change past this share of the bar (hysteresis)
BASELINE_WINDOWS = 8  # the most recent windows of the current phase that make the baseline
WORSE_BY = 0.10
MIN_SHIFT = 0.08  # a split of the step times must shift them by this much...
SPLIT_T = 5.0  # ...and by this many standard errors  # a finding is worse when fixing it would save this much more of the step


@dataclass
class Change:
    kind: str  # "slower", "faster", "new_finding", "worse"
    step: int  # the first step the change is seen at
    window: int
    text: str
    # the finding's cause (new_finding / worse), or the one that explains a slowdown
    cause: CauseId | None = None
    before: float | None = None  # the rate (slower / faster) or the time-saved share (findings) before
    after: float | None = None
    part: Phase | None = None  # the step part that grew most (slower)

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _key(c: Change) -> tuple[str, str | None]:
    """What makes two windows' changes the same change: the kind, and for findings the cause."""
    return (c.kind, None if c.kind in ("slower", "faster") else c.cause)


def rate(w: WindowSummary) -> float | None:
    """Tokens/s when tokens are counted, else steps/s: both from the median step time."""
    if w.typical_tokens_per_s:
        return w.typical_tokens_per_s
    return 1.0 / w.typical_step_s if w.typical_step_s else None


def _log_spread(values: list[float]) -> float:
    """The robust spread (MAD × 1.4826) of the values' logarithms: a rate's noise is a factor, so a window
    at half the rate and one at twice it are equally far from the typical one."""
    if len(values) < 3:
        return 0.0
    logs = [math.log(v) for v in values]
    med = statistics.median(logs)
    return statistics.median(abs(v - med) for v in logs) * 1.4826


def change_point(steps: list[StepRecord], slower: bool = True) -> int | None:
    """The step a shift in step time starts at: the best split of the (capped, logged) step times into a
    before and an after of different means. None when no split explains the series better than noise."""
    if len(steps) < 8:
        return None
    walls = [s.wall_s for s in steps]
    cap = 3 * statistics.median(walls)
    x = [math.log(max(min(w, cap), 1e-9)) for w in walls]
    n = len(x)
    prefix = [0.0]
    for v in x:
        prefix.append(prefix[-1] + v)
    total = prefix[-1]
    best_i, best_gain = None, 0.0
    for i in range(2, n - 1):
        a, b = prefix[i] / i, (total - prefix[i]) / (n - i)
        if (b > a) != slower:
            continue
        gain = i * (n - i) / n * (b - a) ** 2  # between-segment sum of squares
        if gain > best_gain:
            best_i, best_gain = i, gain
    if best_i is None:
        return None
    a, b = prefix[best_i] / best_i, (total - prefix[best_i]) / (n - best_i)
    within = sum((v - a) ** 2 for v in x[:best_i]) + sum((v - b) ** 2 for v in x[best_i:])
    sd = math.sqrt(within / max(n - 2, 1))
    t = abs(b - a) / (sd * math.sqrt(1 / best_i + 1 / (n - best_i))) if sd > 0 else math.inf
    if abs(b - a) < math.log(1 + MIN_SHIFT) or t < SPLIT_T:
        return None  # no split explains the series better than its noise
    return steps[best_i].index


@dataclass
class ChangeDetector:
    min_drop: float = 0.10
    phase: list[WindowSummary] = field(default_factory=list)  # windows since the last rate change
    changes: list[Change] = field(default_factory=list)
    _held: list[Change] = field(default_factory=list)  # the last window's changes, waiting for the next
    _held_window: WindowSummary | None = None
    _since: dict[str, int] = field(
        default_factory=dict
    )  # cause -> window its last confirmed change showed in
    widest: float = 0.0  # the widest bar (log rate) a window was held to: smaller changes could not be seen

    def hidden_below(self) -> float | None:
        """The rate drop the run's noise could hide when it set the bar above ``min_drop``, else None: a run
        with no change past that bar was not shown to be steady, only to have changed less than it."""
        asked = -math.log1p(-min(self.min_drop, 0.99))
        return -math.expm1(-self.widest) if self.widest > asked * 1.0001 else None

    def threshold(self, current: WindowSummary) -> float:
        """The change of the log rate that counts: beyond the run's own noise and ``min_drop`` (a drop by 50%
        is a factor of 2 either way)."""
        rates = [r for r in (rate(w) for w in self.phase[-BASELINE_WINDOWS:]) if r]
        # a window that holds a shift has a wide spread of its own: the baseline's typical window speaks for it
        within = max(
            current.typical_noise, statistics.median(w.typical_noise for w in self.phase[-BASELINE_WINDOWS:])
        )
        return max(-math.log1p(-min(self.min_drop, 0.99)), SIGMAS * _log_spread(rates), SIGMAS * within)

    def add(self, current: WindowSummary, recent_steps: list[StepRecord] | None = None) -> list[Change]:
        """Compare the window that just closed with its phase; ``recent_steps`` (rank 0's steps of the previous
        and this window) place a change at its step. A change is reported once the next window shows it too (a
        burst of load on a shared machine lasting one window is noise, and widens the noise for later)."""
        baseline = self.phase[-BASELINE_WINDOWS:]
        rate_kinds = ("slower", "faster")
        held = {_key(h) for h in self._held}
        found: list[Change] = []
        if baseline:
            limit = self.threshold(current)
            self.widest = max(self.widest, limit)
            moved = self._rate(current, baseline, recent_steps or [], limit, CONFIRM_SHARE * limit)
            if moved is not None and (moved[1] > limit or _key(moved[0]) in held):
                found.append(moved[0])  # past the bar, or past 3/4 of it when confirming its kind
            found += self._findings(current, baseline, recent_steps or [])
        seen = {_key(c) for c in found}
        # A held rate change is confirmed by the same kind of change in this window, and told from this window
        # (placed over both windows' steps, measured from the old phase): when a burst of load in the held
        # window is followed by a real drop, the drop is the change, not the burst. A finding keeps the held
        # window's version, where it first showed.
        confirmed = [c for c in found if c.kind in rate_kinds and _key(c) in held]
        confirmed += [c for c in self._held if c.kind not in rate_kinds and _key(c) in seen]
        fresh = [c for c in found if _key(c) not in held]
        if any(c.kind in rate_kinds for c in confirmed):
            # the new phase starts with this window; what else it shows against the old phase is part of the
            # change: a finding new with it is told now (in the new phase it would never be new again)
            confirmed += [c for c in fresh if c.kind == "new_finding"]
            self.phase = []
            fresh = []
        elif self._held_window is not None and not confirmed:
            self.phase.append(self._held_window)  # what it showed was noise: part of the phase after all
        # (a held window whose change was confirmed holds the change's onset, part before and part after: it
        # stays out of the baseline, where it would pull the old level toward the new one)
        self._held = fresh
        self._held_window = current if fresh else None
        if not fresh:
            self.phase.append(current)
        del self.phase[: max(0, len(self.phase) - 4 * BASELINE_WINDOWS)]
        for c in confirmed:
            if c.cause is not None and c.kind in ("new_finding", "worse"):
                self._since[c.cause] = current.index  # compared from now on with what it has become
        self.changes += confirmed
        return confirmed

    def finish(self) -> list[Change]:
        """The run ended: what its last window showed is reported, unconfirmed (no window came after it)."""
        last = [
            dataclasses.replace(c, text=c.text + " (the run's last window: no later window to confirm it)")
            for c in self._held
        ]
        self._held, self._held_window = [], None
        self.changes += last
        return last

    def _rate(
        self,
        current: WindowSummary,
        baseline: list[WindowSummary],
        steps: list[StepRecord],
        limit: float,
        floor: float,
    ) -> tuple[Change, float] | None:
        """The window's rate change against the baseline, with its size (the log of the rates' ratio), when past
        ``floor``; the text gives ``limit``, the run's noise bar, as the drop or rise it allows."""
        before_rates = [r for r in (rate(w) for w in baseline) if r]
        now = rate(current)
        if not before_rates or not now:
            return None
        before = statistics.median(before_rates)
        relative = now / before - 1.0
        moved = abs(math.log(now / before))
        if moved <= floor:
            return None
        slower = relative < 0
        allowed = -math.expm1(-limit) if slower else math.expm1(limit)
        kind = "slower" if slower else "faster"
        # at the shift inside the previous and this window's steps; when they run level, the onset was the
        # start of the window that first showed it (the held one, when this one confirms it)
        onset = next((h.step for h in self._held if h.kind == kind), current.first_step)
        step = change_point(steps, slower) or onset
        unit = "tokens/s" if current.typical_tokens_per_s else "steps/s"
        verb = "fell" if slower else "rose"
        text = (
            f"from step {step:,} {unit} {verb} {abs(relative):.0%} ({_num(before)} → {_num(now)}; "
            f"the run's noise allows a {allowed:.0%} {'drop' if slower else 'rise'})"
        )
        part = _grown_part(current, baseline) if slower else None
        if part is not None:
            old = statistics.median(w.typical_parts.get(part, 0.0) for w in baseline)
            text += (
                f": {part.noun} went from {old:.3f} s to {current.typical_parts[part]:.3f} s in a typical step "
                f"({part.where})"
            )
        old_causes = {f.cause for w in baseline for f in w.findings}
        new = [f for f in current.findings if f.cause not in old_causes]
        cause = new[0].cause if new else None
        if new:
            text += f"; new finding: {new[0].cause} ({new[0].summary})"
        return Change(kind, step, current.index, text, cause, before, now, part), moved

    def _findings(
        self, current: WindowSummary, baseline: list[WindowSummary], steps: list[StepRecord]
    ) -> list[Change]:
        out = []
        # a finding that appears with a shift in step time starts where the shift does, when inside this window
        shift = change_point([s for s in steps if s.index >= current.first_step - 1])
        start = shift if shift is not None and shift > current.first_step else current.first_step
        for f in current.findings:
            since = self._since.get(f.cause, -1)
            own = [b for b in baseline if b.index >= since]
            if not own:
                continue
            earlier = [b.finding(f.cause) for b in own]
            seen = [e for e in earlier if e is not None]
            if not seen:
                if Severity(f.severity) is Severity.LOW:
                    continue  # a low finding that appears is no change worth a line
                out.append(
                    Change(
                        "new_finding",
                        start,
                        current.index,
                        f"from step {start:,} new finding {f.cause} ({f.severity}): {f.summary}",
                        f.cause,
                        None,
                        f.time_saved_frac,
                    )
                )
                continue
            old = statistics.median(e.time_saved_frac for e in seen)
            if len(seen) == len(own) and f.time_saved_frac - old >= WORSE_BY:
                out.append(
                    Change(
                        "worse",
                        current.first_step,
                        current.index,
                        f"from step {current.first_step:,} {f.cause} got worse: fixing it would now save "
                        f"{f.time_saved_frac:.0%} of step time (was {old:.0%}): {f.summary}",
                        f.cause,
                        old,
                        f.time_saved_frac,
                    )
                )
        return out


def _grown_part(current: WindowSummary, baseline: list[WindowSummary]) -> Phase | None:
    grown: dict[Phase, float] = {}
    for part, now in current.typical_parts.items():  # medians: a stall in one window does not explain a shift
        olds = [w.typical_parts[part] for w in baseline if part in w.typical_parts]
        if olds:
            grown[part] = now - statistics.median(olds)
    if not grown:
        return None
    part = max(grown, key=lambda k: grown[k])
    return part if grown[part] > 0 else None


def _num(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:,.2f}"
