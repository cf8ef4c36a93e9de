"""What each fix would save over the rest of the run, in wall time, GPU-hours and money.

A finding's estimated speed-up says which share of every step its fix saves (1 − 1/speed-up). Over the steps
the run has still to go that is wall time; × the job's GPUs, GPU-hours; × a price per GPU-hour, money. Only
where the run's length is known: the Trainer's ``max_steps`` (or its epochs × steps per epoch), Lightning's
limits, ``trainer_state.json``'s ``max_steps``, a config's ``max_steps`` or the user's ``--total-steps``. A plain
loop says nothing, and nothing is guessed: one note says the length is unknown, and no finding gets a saving.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from pitstop.core.findings import Finding, Saving
from pitstop.core.profile import RunProfile, RunTotals
from pitstop.core.vocabulary import Device, Source
from pitstop.diagnose.metrics import Metrics

PRICE_ENV = "PITSTOP_PRICE_PER_GPU_HOUR"
TOTAL_STEPS_OPTION = "--total-steps"
MAX_TOTAL_STEPS = 10**12  # past any run; a longer "length" is a typo
PROBED = (Source.DOCTOR, Source.CALLBACK, Source.WATCH, Source.TUNE)  # step indexes are the run's own
UNKNOWN = (
    "time and money each fix would save over the rest of the run: not given, because the run's length is "
    f"unknown (a plain loop does not say it; `pitstop doctor` and `analyze` take {TOTAL_STEPS_OPTION} N)"
)


@dataclass(frozen=True)
class RunLength:
    """How many optimizer steps the run is meant to take, how many it had done when measured, who said so."""

    total_steps: int
    done_steps: int | None  # None: how far it had got is unknown, and every step is counted as still to go
    source: str

    @property
    def remaining(self) -> int:
        return max(0, self.total_steps - (self.done_steps or 0))


def steps_done(profile: RunProfile) -> int | None:
    """The run's own step count when the measurement ended: the probe's last step plus the steps a resumed
    run (or, for ``attach``, the run before the probe was armed) had done, or the Trainer's ``global_step`` of
    an offline run; None when neither is known (a trace's step numbers are the profiler's, not the run's)."""
    rank = next((r for r in profile.ranks if r.steps), None)
    if rank is not None and profile.source in PROBED:
        return rank.steps[-1].index + (rank.environment.step_offset or 0)
    if rank is not None and profile.source == Source.ATTACH and rank.environment.step_offset is not None:
        # the probe attach arms mid-run counts from the arming: the run's own count only where its trainer
        # said how far it had got (a sampled view or a plain loop does not)
        return rank.steps[-1].index + rank.environment.step_offset
    totals = profile.totals
    return totals.steps if totals is not None and totals.steps else None


def run_length(profile: RunProfile, total_steps: int | None = None) -> RunLength | None:
    """The run's length: ``total_steps`` (the user's) first, else what the run or its files said; None when
    nothing did."""
    env = profile.environment
    if total_steps:
        return RunLength(total_steps, steps_done(profile), TOTAL_STEPS_OPTION)
    if env.total_steps:
        return RunLength(env.total_steps, steps_done(profile), env.total_steps_from or "the run's config")
    return None


def step_seconds(metrics: Metrics, totals: RunTotals | None) -> float | None:
    """The measured median step time, else the Trainer's training time (evaluation out) over its steps."""
    if metrics.step_time_s:
        return metrics.step_time_s
    if totals is None or not totals.train_s or not totals.steps:
        return None
    eval_s = totals.eval_s or 0.0
    train_s = totals.train_s - eval_s if eval_s < totals.train_s else totals.train_s
    return train_s / totals.steps


def gpus_paid(profile: RunProfile) -> int:
    """The GPUs the job pays for while it runs: none on a CPU run (its saving is wall time alone, never money
    at a GPU's price); else the GPUs its processes hold (``RunProfile.gpus_held``: several per process under
    a device map)."""
    return 0 if profile.environment.device == Device.CPU else profile.gpus_held


def saving_of(
    finding: Finding, length: RunLength, step_s: float, gpus: int, price: float | None
) -> Saving | None:
    """What fixing ``finding`` saves over the steps still to go; None without an estimated speed-up. With no
    GPUs (a CPU run) there are no GPU-hours and no money, whatever the price."""
    if not finding.est_speedup or finding.est_speedup <= 1.0:
        return None
    seconds = length.remaining * step_s * finding.time_saved_frac
    gpu_hours = seconds * gpus / 3600.0
    price = price if gpus else None
    return Saving(
        seconds=seconds,
        gpu_hours=gpu_hours,
        remaining_steps=length.remaining,
        total_steps=length.total_steps,
        step_s=step_s,
        gpus=gpus,
        length_from=length.source,
        price_per_gpu_hour=price,
        money=None if price is None else gpu_hours * price,
    )


def add_savings(
    findings: list[Finding],
    profile: RunProfile,
    metrics: Metrics,
    price: float | None = None,
    total_steps: int | None = None,
) -> str | None:
    """Give every finding with an estimated speed-up its saving over the rest of the run (in place); the one
    note to add where none could be given (length or step time unknown, the run already done), else None."""
    if not any(f.est_speedup and f.est_speedup > 1.0 for f in findings):
        return None
    length = run_length(profile, total_steps)
    if length is None:
        return UNKNOWN
    step_s = step_seconds(metrics, profile.totals)
    if not step_s:
        return f"the run is {length.total_steps:,} steps ({length.source}) but its step time is unknown: no saving"
    if length.remaining == 0:
        return (
            f"the run had done all its {length.total_steps:,} steps ({length.source}) when measured: "
            "no steps left to save time on"
        )
    gpus = gpus_paid(profile)
    for finding in findings:
        finding.saving = saving_of(finding, length, step_s, gpus, price)
    if length.done_steps is None:
        return (
            f"how far the run had got is unknown: savings count all {length.total_steps:,} steps "
            f"({length.source}) as still to go"
        )
    return None


def parse_price(text: str | None) -> float | None:
    """A price per GPU-hour from text (None: none given); ValueError when it is not a positive number."""
    if text is None or not text.strip():
        return None
    try:
        price = float(text)
    except ValueError:
        price = math.nan
    if not math.isfinite(price) or not 0 < price < 1e6:
        raise ValueError(f"{text[:40]!r}: not a price per GPU-hour (a positive number, e.g. 2.5)")
    return price


def parse_total_steps(text: str | None) -> int | None:
    """A run's length in optimizer steps from text (None: none given); ValueError when it is not a whole
    number of steps (1e3 and 2.5 are refused rather than rounded: a length is counted, not measured)."""
    if text is None or not text.strip():
        return None
    digits = text.strip().replace("_", "")
    if not digits.isascii() or not digits.isdigit() or not 0 < int(digits) <= MAX_TOTAL_STEPS:
        raise ValueError(f"{text[:40]!r}: not a number of optimizer steps (a whole number from 1, e.g. 5000)")
    return int(digits)


def price_from_env() -> float | None:
    """$PITSTOP_PRICE_PER_GPU_HOUR, or None where it is unset or not a price (a callback inside the user's job
    must not fail the job over it)."""
    try:
        return parse_price(os.environ.get(PRICE_ENV))
    except ValueError:
        return None
