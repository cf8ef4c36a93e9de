"""One trial: the job runs under the probe with a set of fixes for a short window of steps."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pitstop.core.profile import RunProfile
from pitstop.core.vocabulary import Source
from pitstop.diagnose import Diagnosis, diagnose
from pitstop.probe.stopping import WindowRule
from pitstop.runner.measure import StepWindow, measure
from pitstop.trials.request import FixRequest, read_reports

OOM = re.compile(r"out of memory|OutOfMemoryError|MemoryError|Cannot allocate memory", re.IGNORECASE)


@dataclass
class Window:
    fixes: tuple[str, ...]
    diagnosis: Diagnosis | None = None
    real_tokens_per_s: float | None = None
    spread: float | None = None  # relative standard error of the window's throughput
    losses: list[float] = field(default_factory=list)
    applied: dict[str, str] = field(default_factory=dict)
    applied_params: dict[str, dict[str, Any]] = field(default_factory=dict)  # fix -> its advice's parameters
    skipped: dict[str, str] = field(default_factory=dict)
    revoked: dict[str, str] = field(default_factory=dict)  # applied, then found not in effect in some process
    redirected: list[str] = field(default_factory=list)
    error: str | None = None  # why no throughput was measured (crash, out of memory, …)
    # what real_tokens_per_s counts: "tokens" / "samples" when real tokens are unknown, "steps" when rows are too
    rate_of: str = "real tokens"
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and self.real_tokens_per_s is not None


def throughput(diagnosis: Diagnosis) -> tuple[float | None, float | None]:
    """Real tokens/s over the window (all ranks) and its relative standard error, as the diagnosis's
    metrics state them (computed once, in diagnose/metrics.py)."""
    m = diagnosis.metrics
    if m.steps_measured == 0:
        return None, None  # a rate the Trainer counted is no measurement of this window
    return m.real_tokens_per_s, m.throughput_spread


def failure_line(log: Path | None) -> str:
    """The line of the job's output that says why it stopped (the exception, as a rule)."""
    if log is None or not log.exists():
        return "no output"
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for line in reversed(lines):
        if OOM.search(line):
            return "out of memory: " + line[:200]
    for line in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b", line):
            return line[:240]
    return lines[-1][:240] if lines else "no output"


def counted_in(profile: RunProfile, unit: str) -> RunProfile:
    """A copy of the profile whose steps count ``unit`` (all tokens, samples, or each step as one) as their real
    tokens: the rate tune compares when a job's batches do not say which of their tokens are real."""
    ranks = [
        replace(
            r, steps=[replace(s, real_tokens=1 if unit == "steps" else getattr(s, unit)) for s in r.steps]
        )
        for r in profile.ranks
    ]
    return replace(profile, ranks=ranks)


def run_window(
    command: list[str],
    request: FixRequest,
    steps: int,
    warmup: int,
    timeout_s: float | None,
    on_step: Callable[[int], None] | None = None,
    rule: WindowRule | None = None,
    on_wait: Callable[[], None] | None = None,
) -> Window:
    """One window of the job with the requested fixes. With a ``rule`` the window ends when its step time is
    precise enough (``steps`` and ``warmup`` then apply only to a job of several ranks). ``on_wait`` is called
    every few tenths of a second while the job runs, before its first step too (tune's heartbeat)."""
    window = Window(fixes=tuple(sorted(request.fixes)))
    out = Path(tempfile.mkdtemp(prefix="pitstop-tune-"))
    request.report_dir = out / "fixes"
    request.report_dir.mkdir()
    started = time.monotonic()
    try:
        result = measure(
            command,
            StepWindow(steps=steps, warmup=warmup, rule=rule),
            on_step=on_step,
            on_tick=None if on_wait is None else (lambda _folder: on_wait()),
            timeout_s=timeout_s,
            extra_env=request.to_env(),
            out_dir=out,
            source=Source.TUNE,
        )
        launch = result.launch
        window.seconds = time.monotonic() - started
        reports = read_reports(request.report_dir)
        for report in reports:
            window.applied.update(report.get("applied", {}))
            window.applied_params.update(report.get("params", {}))
            window.redirected += report.get("redirected", [])
            for fix, why in report.get("skipped", {}).items():
                window.skipped.setdefault(fix, why)
            window.revoked.update(report.get("revoked", {}))
        for fix in window.revoked:  # one process that did not run the fix makes the whole window not count
            window.applied.pop(fix, None)
        window.losses = next((r.get("losses", []) for r in reports if r.get("losses")), [])
        profile = result.profile
        if profile is None or (not result.stopped_by_probe and result.exit_code != 0):
            timed_out = launch.stopped_by == "timeout"
            window.error = (
                result.message or "the probe failed"
                if launch.probe_lost
                else f"did not finish its window in {timeout_s:.0f} s"
                if timed_out
                else f"the job {result.death}"
                if result.death
                else failure_line(launch.log_path)
                if launch.log_path
                else result.message or "nothing measured"
            )
            return window
        window.diagnosis = diagnose(profile)
        window.real_tokens_per_s, window.spread = throughput(window.diagnosis)
        # one unknown number never stops tune: compare on what is known, down to steps/s (a fix that changes
        # the batch shape is then not judged: verdict.judge)
        for unit in ("tokens", "samples", "steps"):
            if window.real_tokens_per_s is None:
                window.real_tokens_per_s, window.spread = throughput(diagnose(counted_in(profile, unit)))
                window.rate_of = unit
        if window.real_tokens_per_s is None:
            window.error = "no step was measured"
        return window
    finally:
        shutil.rmtree(out, ignore_errors=True)
