"""One trial: the job runs under the probe with a set of fixes for a short window of steps."""

from __future__ import annotations

import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from pitstop.diagnose import Diagnosis, diagnose
from pitstop.profile import RunProfile
from pitstop.runner.measure import StepWindow, measure
from pitstop.trials.request import FixRequest, read_reports

CHUNKS = 5  # the window's steps are cut into this many runs of steps to estimate its spread
OOM = re.compile(r"out of memory|OutOfMemoryError|MemoryError|Cannot allocate memory", re.IGNORECASE)


@dataclass
class Window:
    fixes: tuple[str, ...]
    diagnosis: Diagnosis | None = None
    real_tokens_per_s: float | None = None
    spread: float | None = None  # relative standard error of the window's throughput
    losses: list[float] = field(default_factory=list)
    applied: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    redirected: list[str] = field(default_factory=list)
    error: str | None = None  # why no throughput was measured (crash, out of memory, …)
    rate_of: str = "real tokens"  # what real_tokens_per_s counts ("tokens" / "samples" when real is unknown)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and self.real_tokens_per_s is not None


def throughput(profile: RunProfile) -> tuple[float | None, float | None]:
    """Real tokens/s over the window (all ranks) and its relative standard error, from the rate of
    ``CHUNKS`` consecutive runs of steps of the slowest rank."""
    ranks = [r for r in profile.ranks if r.steps]
    if not ranks or any(s.real_tokens is None for r in ranks for s in r.steps):
        return None, None
    total = sum(sum(s.real_tokens or 0 for s in r.steps) / sum(s.wall_s for s in r.steps) for r in ranks)
    slowest = max(ranks, key=lambda r: sum(s.wall_s for s in r.steps))
    steps = slowest.steps
    n = min(CHUNKS, len(steps))
    if n < 2:
        return total, None
    size = len(steps) / n
    rates = []
    for i in range(n):
        chunk = steps[round(i * size) : round((i + 1) * size)]
        rates.append(sum(s.real_tokens or 0 for s in chunk) / sum(s.wall_s for s in chunk))
    mean = statistics.fmean(rates)
    return total, statistics.stdev(rates) / mean / n**0.5 if mean else None


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
    """A copy of the profile whose steps count ``unit`` (all tokens, or samples) as their real tokens: the rate
    tune compares when a job's batches do not say which of their tokens are real."""
    ranks = [
        replace(r, steps=[replace(s, real_tokens=getattr(s, unit)) for s in r.steps]) for r in profile.ranks
    ]
    return replace(profile, ranks=ranks)


def run_window(
    command: list[str],
    request: FixRequest,
    steps: int,
    warmup: int,
    timeout_s: float | None,
    on_step: Callable[[int], None] | None = None,
) -> Window:
    window = Window(fixes=tuple(sorted(request.fixes)))
    out = Path(tempfile.mkdtemp(prefix="pitstop-tune-"))
    request.report_dir = out / "fixes"
    request.report_dir.mkdir()
    started = time.monotonic()
    try:
        result = measure(
            command,
            StepWindow(steps=steps, warmup=warmup),
            on_step=on_step,
            timeout_s=timeout_s,
            extra_env=request.to_env(),
            out_dir=out,
            source="tune",
        )
        launch = result.launch
        window.seconds = time.monotonic() - started
        reports = read_reports(request.report_dir)
        for report in reports:
            window.applied.update(report.get("applied", {}))
            window.redirected += report.get("redirected", [])
            for fix, why in report.get("skipped", {}).items():
                window.skipped.setdefault(fix, why)
        window.losses = next((r.get("losses", []) for r in reports if r.get("losses")), [])
        profile = result.profile
        if profile is None or (not result.stopped_by_probe and result.exit_code != 0):
            timed_out = launch.stopped_by == "timeout"
            window.error = (
                f"did not finish its window in {timeout_s:.0f} s"
                if timed_out
                else f"the job {result.death}"
                if result.death
                else failure_line(launch.log_path)
                if launch.log_path
                else result.message or "nothing measured"
            )
            return window
        window.diagnosis = diagnose(profile)
        window.real_tokens_per_s, window.spread = throughput(profile)
        for unit in ("tokens", "samples"):  # one unknown number never stops tune: compare on what is known
            if window.real_tokens_per_s is None:
                window.real_tokens_per_s, window.spread = throughput(counted_in(profile, unit))
                window.rate_of = unit
        if window.real_tokens_per_s is None:
            window.error = "the job's batches carry neither token ids nor rows pitstop can count"
        return window
    finally:
        shutil.rmtree(out, ignore_errors=True)
