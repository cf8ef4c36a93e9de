"""When a measurement window has seen enough: warm-up over when step times settle, measuring over when the
mean step time is known precisely enough.

A fixed 50-step window wastes minutes on a job whose steps take seconds and is too short for a noisy one.
Here the window ends once the 95% confidence interval of the mean step time is within ``precision`` of it
(at least ``min_steps``, at most ``max_steps`` or ``max_seconds``), so steady jobs stop early and noisy ones
measure longer. Pure arithmetic on the host clock's step times: no torch, no sync.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field


@dataclass(frozen=True)
class WindowRule:
    precision: float = 0.03  # half-width of the 95% interval of the mean step time, relative to it
    min_steps: int = 8
    max_steps: int = 300
    max_seconds: float | None = None  # of measuring, after the warm-up
    min_warmup: int = 2  # the first steps build caches, compile, start workers: never measured
    max_warmup: int = 30
    max_warmup_seconds: float | None = None  # a machine too noisy to settle still gets measured
    settle_steps: int = 5  # the warm-up is over when this many steps in a row agree
    settle_tolerance: float = 0.25  # ... each within this share of their median


_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306)  # degrees of freedom 1..8


def t_quantile(n: int) -> float:
    """Two-sided 95% Student t quantile for n samples (n-1 degrees of freedom): the table to 8, then a
    series within 1%."""
    dof = max(n - 1, 1)
    return _T95[dof - 1] if dof <= len(_T95) else 1.96 + 2.4 / dof + 2.0 / dof**2


@dataclass
class WindowTracker:
    """Fed one step time at a time; says when the warm-up ends and when measuring may stop."""

    rule: WindowRule = field(default_factory=WindowRule)
    warmup_steps: int | None = None  # known once the warm-up is over
    recent: list[float] = field(default_factory=list)
    n: int = 0
    mean: float = 0.0
    m2: float = 0.0  # Welford's running sum of squared deviations
    measured_s: float = 0.0
    warmup_s: float = 0.0

    def warming(self, index: int, wall_s: float) -> bool:
        """Record a warm-up step; True when the warm-up ends with this step."""
        self.recent = [*self.recent[-(self.rule.settle_steps - 1) :], wall_s]
        settled = len(self.recent) >= self.rule.settle_steps and _agree(
            self.recent, self.rule.settle_tolerance
        )
        if index >= self.rule.max_warmup or (index >= self.rule.min_warmup and settled):
            self.warmup_steps = index
            return True
        return False

    def add(self, wall_s: float) -> None:
        self.n += 1
        delta = wall_s - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (wall_s - self.mean)
        self.measured_s += wall_s

    @property
    def relative_halfwidth(self) -> float | None:
        """Half-width of the 95% interval of the mean step time over the mean; None before 2 steps."""
        if self.n < 2 or self.mean <= 0:
            return None
        sd = math.sqrt(self.m2 / (self.n - 1))
        return t_quantile(self.n) * sd / math.sqrt(self.n) / self.mean

    def done(self) -> bool:
        rule = self.rule
        if self.n >= rule.max_steps or (rule.max_seconds is not None and self.measured_s >= rule.max_seconds):
            return self.n >= 2
        width = self.relative_halfwidth
        return self.n >= rule.min_steps and width is not None and width <= rule.precision

    def reason(self) -> str:
        """Why measuring stopped, for the report."""
        width = self.relative_halfwidth
        precise = f"±{width:.1%}" if width is not None else "unknown precision"
        if self.n >= self.rule.max_steps:
            return f"{self.n} steps (the most a window takes), {precise}"
        if self.rule.max_seconds is not None and self.measured_s >= self.rule.max_seconds:
            return f"{self.measured_s:.0f} s (the window's time limit), {precise}"
        return f"{self.n} steps: mean step time known to {precise} (95%)"


def _agree(times: list[float], tolerance: float) -> bool:
    median = statistics.median(times)
    return median > 0 and all(abs(t - median) <= tolerance * median for t in times)
