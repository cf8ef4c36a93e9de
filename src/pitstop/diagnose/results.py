"""The typed results a diagnosis carries beside its Metrics: per-rank figures, per-step series, GPU-sample
windows and the rank the pictures show. Reports, tune and the history only read these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pitstop.core.profile import RunProfile, from_jsonable, to_jsonable
from pitstop.diagnose.gpu_windows import GpuWindow, gpu_windows
from pitstop.diagnose.metrics import RankMetrics, rank_metrics
from pitstop.diagnose.series import ShownRank, StepSeries, shown_rank, step_series


@dataclass
class RunResults:
    ranks: list[RankMetrics] = field(default_factory=list)  # in rank order (numeric: 2 before 10)
    series: list[StepSeries] = field(default_factory=list)  # one per rank that measured steps
    gpus: list[GpuWindow] = field(default_factory=list)  # one per rank that logged GPU utilization
    shown: ShownRank = field(default_factory=lambda: ShownRank(None, "nothing measured per rank"))

    def series_of(self, rank: int | None) -> StepSeries | None:
        return next((s for s in self.series if s.rank == rank), None)

    def gpu_of(self, rank: int | None) -> GpuWindow | None:
        return next((g for g in self.gpus if g.gpu == rank), None)

    @property
    def shown_series(self) -> StepSeries | None:
        return self.series_of(self.shown.rank)

    @property
    def shown_gpu(self) -> GpuWindow | None:
        """The shown rank's GPU window; for a run whose shown rank logged none, the first that did."""
        return self.gpu_of(self.shown.rank) or (self.gpus[0] if self.gpus else None)

    def to_dict(self) -> dict[str, Any]:
        """The keys this adds to ``pitstop.run/1`` (``ranks`` was there before, with the same rows)."""
        return {
            "ranks": [to_jsonable(r) for r in self.ranks],
            "step_series": [to_jsonable(s) for s in self.series],
            "gpu_windows": [to_jsonable(g) for g in self.gpus],
            "shown_rank": to_jsonable(self.shown),
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> RunResults:
        return cls(
            ranks=[from_jsonable(RankMetrics, r) for r in doc.get("ranks") or []],
            series=[from_jsonable(StepSeries, s) for s in doc.get("step_series") or []],
            gpus=[from_jsonable(GpuWindow, g) for g in doc.get("gpu_windows") or []],
            shown=from_jsonable(ShownRank, doc["shown_rank"]),
        )


def results_of(profile: RunProfile, gpus: list[GpuWindow] | None = None) -> RunResults:
    gpus = gpu_windows(profile) if gpus is None else gpus
    ordered = sorted(profile.ranks, key=lambda r: r.rank)
    return RunResults(
        ranks=[rank_metrics(r) for r in ordered],
        series=[step_series(r) for r in ordered if r.steps],
        gpus=gpus,
        shown=shown_rank(profile, gpus),
    )
