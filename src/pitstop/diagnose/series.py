"""Per-step series of each rank and the rank the pictures show: computed here once, only drawn by reports.

A measured step's number is ``warmup_steps + position`` (1-based): the optimizer steps counted from the
start of the process, as the probe's ``StepRecord.index`` and the Trainer's ``global_step`` count them.
Steps follow one another without gaps, so a step ends at the window start plus the cumulative step
times; a GPU sample belongs to the step in progress at its time.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from itertools import accumulate

from pitstop.core.profile import GpuSample, RankProfile, RunProfile, StepRecord
from pitstop.core.vocabulary import Phase
from pitstop.diagnose.gpu_windows import GpuWindow, window_samples

GPU_FIELDS = ("util", "mem_used", "mem_total", "pcie_rx", "pcie_tx", "sm_clock", "power_w")


@dataclass
class StepSeries:
    """One rank's measured steps as series of equal length. Rates are per second of the step's wall time;
    ``None`` where the step did not count the figure."""

    rank: int
    steps: list[int] = field(default_factory=list)  # optimizer step numbers (warm-up + position)
    end_s: list[float] = field(default_factory=list)  # end of each step, seconds after the window start
    wall_s: list[float] = field(default_factory=list)
    # Phase.breakdown(): GENERATE among them only where a step generated (an online RL trainer's rollouts)
    phases: dict[str, list[float | None]] = field(default_factory=dict)
    tokens_per_s: list[float | None] = field(default_factory=list)
    real_tokens_per_s: list[float | None] = field(default_factory=list)
    padding_frac: list[float | None] = field(default_factory=list)
    gpu: dict[str, list[float | None]] = field(default_factory=dict)  # GpuSample field: mean within each step

    @property
    def rate(self) -> tuple[list[float], str]:
        """The per-step rate a picture of this rank draws: real tokens/s, else all tokens/s."""
        for values, what in ((self.real_tokens_per_s, "real tokens/s"), (self.tokens_per_s, "tokens/s")):
            known = [v for v in values if v is not None]
            if known:
                return known, what
        return [], ""

    @property
    def mean_phases_s(self) -> dict[str, float]:
        """Seconds per step in each phase, averaged over the measured steps (phases never measured left out)."""
        out = {}
        for name, values in self.phases.items():
            if any(values):
                out[name] = math.fsum(v or 0.0 for v in values) / len(values)
        return out

    @property
    def phases_known(self) -> bool:
        """Whether the steps were split into phases (a trace or a log carries only wall times)."""
        return any(v for name in Phase.timed() for v in self.phases.get(name, []))


def _rate(count: int | None, wall: float) -> float | None:
    return None if count is None or wall <= 0 else count / wall


def _gpu_per_step(rank: RankProfile, ends: list[float]) -> dict[str, list[float | None]]:
    """Mean of each GpuSample field over the samples taken during each step (none outside the window)."""
    if not ends or rank.window_start_t is None:
        return {}
    by_step: list[list[GpuSample]] = [[] for _ in ends]
    for sample in window_samples(rank):
        offset = sample.t - rank.window_start_t
        if 0 <= offset < ends[-1]:
            by_step[bisect.bisect_right(ends, offset)].append(sample)
    out: dict[str, list[float | None]] = {}
    for name in GPU_FIELDS:
        column: list[float | None] = []
        for samples in by_step:
            values = [float(v) for s in samples if (v := getattr(s, name)) is not None and math.isfinite(v)]
            column.append(math.fsum(values) / len(values) if values else None)
        if any(v is not None for v in column):
            out[name] = column
    return out


def _padding(s: StepRecord) -> float | None:
    return 1.0 - s.real_tokens / s.tokens if s.tokens and s.real_tokens is not None else None


def step_series(rank: RankProfile) -> StepSeries:
    ends = list(accumulate(s.wall_s for s in rank.steps))
    timed = Phase.timed(generation=any(s.generate_s for s in rank.steps))
    phases: dict[str, list[float | None]] = {name: [getattr(s, name) for s in rank.steps] for name in timed}
    phases[Phase.OTHER] = [max(s.wall_s - sum(getattr(s, n) or 0.0 for n in timed), 0.0) for s in rank.steps]
    return StepSeries(
        rank=rank.rank,
        steps=[rank.warmup_steps + i + 1 for i in range(len(rank.steps))],
        end_s=ends,
        wall_s=[s.wall_s for s in rank.steps],
        phases=phases,
        tokens_per_s=[_rate(s.tokens, s.wall_s) for s in rank.steps],
        real_tokens_per_s=[_rate(s.real_tokens, s.wall_s) for s in rank.steps],
        padding_frac=[_padding(s) for s in rank.steps],
        gpu=_gpu_per_step(rank, ends),
    )


@dataclass
class ShownRank:
    """The one rank the pictures draw (a blend of ranks would be no step anyone ran) and why that one."""

    rank: int | None
    why: str


def shown_rank(profile: RunProfile, gpus: list[GpuWindow]) -> ShownRank:
    """The slowest rank with measured steps (it paces the job, and the headline step time is its);
    without steps, the GPU that worked most in the log."""
    ranks = sorted((r for r in profile.ranks if r.steps), key=lambda r: r.rank)
    if len(ranks) == 1:
        return ShownRank(ranks[0].rank, "the only rank measured")
    if ranks:
        slowest = max(ranks, key=lambda r: r.wall_s)  # max keeps the lowest rank on a tie
        return ShownRank(slowest.rank, "the slowest rank: it paces the job")
    if len(gpus) == 1:
        return ShownRank(gpus[0].gpu, "the only GPU logged")
    if gpus:
        busiest = max(gpus, key=lambda w: (w.active_s * (w.active_util or 0.0), -w.gpu))
        return ShownRank(busiest.gpu, "the GPU that worked most")
    return ShownRank(None, "nothing measured per rank")
