"""Windows of a long run: every N steps or T seconds, each summarised with the doctor's own metrics and rules.

Why summaries: a 20-hour run has millions of step records; memory must not grow with it. Each rank's profile is
held only for the steps of windows not closed yet; when a window closes, ``diagnose`` runs on the window sliced
from it (``slicing.py``: its steps and everything measured in them, the collectors' per-step counts included)
and only the summary (a few numbers and the findings' causes) is kept. The full series goes to disk
(``store.py``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from pitstop.core.profile import Environment, GpuSample, RankProfile, RunProfile, StepRecord
from pitstop.core.vocabulary import CauseId, Phase, Source
from pitstop.diagnose import diagnose
from pitstop.diagnose.cost import run_cost
from pitstop.diagnose.metrics import Metrics
from pitstop.wholerun.slicing import slice_rank, step_span


@dataclass(frozen=True)
class WindowSpec:
    """A window closes after ``steps`` steps or ``seconds`` of rank 0's step time, whichever comes first."""

    steps: int = 200
    seconds: float | None = None

    def __post_init__(self) -> None:
        if self.steps < 4:
            raise ValueError("a window needs at least 4 steps")
        if self.seconds is not None and self.seconds <= 0:
            raise ValueError("a window's seconds must be positive")


@dataclass
class FindingBrief:
    """What a window's finding says, small enough to keep for every window of a long run."""

    cause: CauseId
    severity: str
    time_saved_frac: float  # share of step time fixing it would save (0 when not estimable)
    summary: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "severity": self.severity,
            "time_saved_frac": round(self.time_saved_frac, 4),
            "summary": self.summary,
        }


@dataclass
class WindowSummary:
    index: int
    first_step: int
    last_step: int
    start_s: float  # rank 0's summed step time before the window (seconds into the measured run)
    seconds: float  # rank 0's summed step time in the window
    steps: int
    step_time_s: float | None  # median
    typical_step_s: float | None  # median step time: what a rare stall does not move
    tokens_per_s: float | None
    real_tokens_per_s: float | None
    typical_tokens_per_s: float | None  # tokens per step / median step time (rank 0), stalls left out
    typical_noise: float  # relative standard error of the median step time (robust spread / sqrt(n))
    mfu: float | None
    data_wait_frac: float | None
    padding_frac: float | None
    gpu_util: float | None
    sync_frac: float | None
    throughput_spread: float | None  # the doctor's within-window spread of real tokens/s
    # each Phase of a step (what a change is explained by), seconds per step of rank 0: the mean, and the
    # median (what stalls leave alone)
    parts: dict[Phase, float] = field(default_factory=dict)
    typical_parts: dict[Phase, float] = field(default_factory=dict)
    findings: list[FindingBrief] = field(default_factory=list)
    gpu_power_w: float | None = None  # the window's GPUs together, from their power samples
    joules_per_step: float | None = None
    joules_per_real_token: float | None = None
    cost_per_million_real_tokens: float | None = None  # at the watch's price per GPU-hour, where given

    def finding(self, cause: CauseId) -> FindingBrief | None:
        return next((f for f in self.findings if f.cause == cause), None)

    def scalars(self) -> dict[str, float]:
        """The numbers a tracker charts per window (only those known)."""
        values = {
            "tokens_per_s": self.tokens_per_s,
            "real_tokens_per_s": self.real_tokens_per_s,
            "mfu": self.mfu,
            "data_wait_frac": self.data_wait_frac,
            "padding_frac": self.padding_frac,
            "gpu_util": self.gpu_util,
            "sync_frac": self.sync_frac,
            "step_time_s": self.step_time_s,
            "gpu_power_w": self.gpu_power_w,
            "joules_per_step": self.joules_per_step,
            "joules_per_real_token": self.joules_per_real_token,
            "cost_per_million_real_tokens": self.cost_per_million_real_tokens,
        }
        return {k: float(v) for k, v in values.items() if v is not None}

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "findings"}
        out["findings"] = [f.to_dict() for f in self.findings]
        return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarise(index: int, start_s: float, window: RunProfile, price: float | None = None) -> WindowSummary:
    """Diagnose one window (its profile, all ranks, lowest first: ``slicing.slice_run``) with the doctor's rules
    and keep the summary; with a price per GPU-hour, what a million real tokens cost in it."""
    ranks = [r for r in window.ranks if r.steps]
    if not ranks:
        raise ValueError("a window without steps")
    diagnosis = diagnose(window)
    m = diagnosis.metrics
    lead = ranks[0].steps
    walls = [s.wall_s for s in lead]
    typical = _median(walls)
    noise = 0.0
    if typical:
        mad = statistics.median(abs(w - typical) for w in walls) * 1.4826
        noise = 1.2533 * mad / typical / len(walls) ** 0.5
    tokens = [s.tokens for s in lead]
    typical_tps = None
    if typical and all(t is not None for t in tokens):
        typical_tps = statistics.median(t for t in tokens if t is not None) / typical * len(ranks)
    parts: dict[Phase, float] = {}
    typical_parts: dict[Phase, float] = {}
    for name in Phase:
        values = [getattr(s, name) for s in lead]
        if values and all(v is not None for v in values):
            parts[name] = statistics.fmean(v for v in values if v is not None)
            typical_parts[name] = statistics.median(v for v in values if v is not None)
    return WindowSummary(
        index=index,
        first_step=lead[0].index,
        last_step=lead[-1].index,
        start_s=start_s,
        seconds=sum(walls),
        steps=len(lead),
        step_time_s=m.step_time_s,
        typical_step_s=typical,
        tokens_per_s=m.tokens_per_s,
        real_tokens_per_s=m.real_tokens_per_s,
        typical_tokens_per_s=typical_tps,
        typical_noise=noise,
        mfu=m.mfu,
        data_wait_frac=m.data_wait_frac,
        padding_frac=m.padding_frac,
        gpu_util=m.gpu_util,
        sync_frac=m.sync_frac,
        throughput_spread=m.throughput_spread,
        parts=parts,
        typical_parts=typical_parts,
        findings=[
            FindingBrief(f.cause, str(f.severity), f.time_saved_frac, f.summary) for f in diagnosis.findings
        ],
        gpu_power_w=m.gpu_power_w,
        joules_per_step=m.joules_per_step,
        joules_per_real_token=m.joules_per_real_token,
        cost_per_million_real_tokens=_per_million(window, m, price),
    )


def _per_million(window: RunProfile, metrics: Metrics, price: float | None) -> float | None:
    """What a million real tokens cost in the window (``diagnose/cost.py``), where its steps are the whole
    job's: one process's window of a multi-rank job (the in-process watch) has one rank's rate, not the job's."""
    if len(window.ranks) < window.world_size:
        return None
    cost = run_cost(window, metrics, price)
    return None if cost is None else cost.per_million_real_tokens


@dataclass
class Windower:
    """Fed step records as they arrive (any rank, in step order per rank); hands back each window as it closes.

    Rank 0 (the lowest rank seen) decides where a window ends; the window closes once every rank has passed
    that step, so all ranks' steps of the same indices are diagnosed together. Each rank's profile is held
    only for the windows not closed yet; a closing window is sliced from it (``slicing.slice_rank``)."""

    spec: WindowSpec = field(default_factory=WindowSpec)
    environments: dict[int, Environment] = field(default_factory=dict)
    ranks: int | None = None  # ranks fed to this windower; None: the job's world size (the environment says)
    price: float | None = None  # per GPU-hour: each window's cost per million real tokens
    _open: dict[int, RankProfile] = field(default_factory=dict)  # each rank's profile past the closed windows
    _fed: set[int] = field(default_factory=set)  # ranks fed steps (GPU samples alone count no rank)
    _bounds: list[tuple[int, int]] = field(default_factory=list)  # closed-by-rank-0 windows: (first, last)
    _open_first: int | None = None
    _cut_upto: int = 0
    _open_s: float = 0.0
    _elapsed_s: float = 0.0
    _count: int = 0

    def add(
        self, rank: int, records: list[StepRecord], environment: Environment | None = None
    ) -> list[WindowSummary]:
        """Take new records of one rank; return the windows this closes."""
        if environment is not None:
            self.environments[rank] = environment
        self._fed.add(rank)
        self._profile(rank).steps.extend(records)
        return self._close_ready()

    def add_gpu(self, rank: int, samples: list[GpuSample]) -> None:
        """GPU samples stay with the windows not closed yet (bounded by them, like their steps): each goes to the
        window its time falls in, or, where the steps' times are not known, to the next window that closes."""
        self._profile(rank).gpu_samples.extend(samples)

    def _profile(self, rank: int) -> RankProfile:
        if rank not in self._open:
            self._open[rank] = RankProfile(rank=rank)
        return self._open[rank]

    @property
    def _pending(self) -> dict[int, list[StepRecord]]:
        """Each fed rank's steps not in a closed window yet."""
        return {rank: self._open[rank].steps for rank in sorted(self._fed)}

    def expected_ranks(self) -> int:
        """How many ranks feed this windower (given, else the job's world size, else 1)."""
        if self.ranks is not None:
            return self.ranks
        sizes = [e.world_size for e in self.environments.values() if e.world_size]
        return max(sizes) if sizes else 1

    def _cut(self, lead: list[StepRecord]) -> None:
        """Window bounds from the lead rank's steps not yet cut."""
        for record in lead:
            if record.index <= self._cut_upto:
                continue
            self._cut_upto = record.index
            if self._open_first is None:
                self._open_first = record.index
                self._open_s = 0.0
            self._open_s += record.wall_s
            n = record.index - self._open_first + 1
            by_time = self.spec.seconds is not None and self._open_s >= self.spec.seconds and n >= 4
            if n >= self.spec.steps or by_time:
                self._bounds.append((self._open_first, record.index))
                self._open_first = None

    def _close_ready(self, final: bool = False) -> list[WindowSummary]:
        """Windows close once every rank of the job has passed their end (ranks' steps may arrive at different
        times, or one rank's all at once when it ends): each window is diagnosed over all its ranks."""
        if not self._pending or (not final and len(self._pending) < self.expected_ranks()):
            return []
        self._cut(self._pending[min(self._pending)])
        closed = []
        while self._bounds:
            first, last = self._bounds[0]
            if not final and any(not q or q[-1].index < last for q in self._pending.values()):
                break
            self._bounds.pop(0)
            closed.append(self._summarise(first, last))
        return closed

    def _summarise(self, first: int, last: int) -> WindowSummary:
        ranks = []
        for rank, held in sorted(self._open.items()):
            held.environment = self.environments.get(rank, Environment())
            part = slice_rank(held, first, last) if rank in self._fed else None
            span = step_span(held, part.steps) if part is not None else None
            if part is not None:
                ranks.append(part)
            held.steps = [s for s in held.steps if s.index > last]
            # samples after the window wait for the next; where the steps' times are not known, a window takes
            # all the samples fed while it was open
            held.gpu_samples = [s for s in held.gpu_samples if span is not None and s.t > span[1]]
            held.host_samples = [s for s in held.host_samples if span is not None and s.t > span[1]]
        window = RunProfile(source=Source.WATCH, ranks=ranks)
        summary = summarise(self._count, self._elapsed_s, window, self.price)
        self._count += 1
        self._elapsed_s += summary.seconds
        return summary

    def finish(self) -> list[WindowSummary]:
        """Close what is left: a last partial window of at least 4 steps (shorter tails are too few to judge)."""
        if not self._pending:
            return []
        lead = self._pending[min(self._pending)]
        self._cut(lead)
        if self._open_first is not None and lead:
            last = lead[-1].index
            if last - self._open_first + 1 >= 4:
                self._bounds.append((self._open_first, last))
            self._open_first = None
        return self._close_ready(final=True)
