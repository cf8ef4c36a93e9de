"""What every rule reads: the profile, its derived metrics, and a few conveniences."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pitstop.core.findings import Finding
from pitstop.core.profile import Environment, RankProfile, RunProfile, TraceStats
from pitstop.core.vocabulary import Device, Severity, Workload
from pitstop.diagnose.gpu_windows import gpu_windows
from pitstop.diagnose.metrics import Metrics, compute_metrics
from pitstop.diagnose.ranks import RanksAnalysis, Scaling, analyse, scaling
from pitstop.diagnose.results import RunResults, results_of
from pitstop.hardware import GpuSpec, lookup_gpu


@dataclass
class RuleContext:
    profile: RunProfile
    metrics: Metrics
    results: RunResults
    earlier: list[Finding] = field(default_factory=list)  # findings of the rules that ran before
    ranks: RanksAnalysis | None = None  # who waits for whom (multi-rank runs with timed collectives)
    scaling: Scaling | None = None

    @classmethod
    def of(cls, profile: RunProfile) -> RuleContext:
        gpus = gpu_windows(profile)
        metrics = compute_metrics(profile, gpus)
        ranks = analyse(profile)
        scaled = scaling(profile, ranks, metrics.real_tokens_per_s or metrics.tokens_per_s)
        if scaled is not None:
            metrics.scaling_efficiency = scaled.efficiency
        return cls(
            profile=profile, metrics=metrics, results=results_of(profile, gpus), ranks=ranks, scaling=scaled
        )

    @property
    def env(self) -> Environment:
        return self.profile.environment

    @property
    def framework(self) -> str:
        return self.env.framework or "pytorch"

    @property
    def on_gpu(self) -> bool:
        return self.env.on_gpu

    @property
    def gpu(self) -> GpuSpec | None:
        return lookup_gpu(self.env.gpu_name) if self.on_gpu else None

    @property
    def gpu_possible(self) -> bool:
        """Configs and Trainer outputs do not say which device ran; GPU checks on their facts still apply."""
        return self.env.device in (None, Device.CUDA, Device.ROCM)

    @property
    def traces(self) -> list[TraceStats]:
        return [r.trace for r in self.profile.ranks if r.trace is not None]

    @property
    def inference(self) -> bool:
        """Every trace read is of inference or evaluation (no backward, no optimizer): advice is for batches of
        inference, not for a training loop."""
        traces = self.traces
        return bool(traces) and all(t.workload == Workload.INFERENCE for t in traces)

    @property
    def traced(self) -> list[tuple[RankProfile, TraceStats]]:
        """The ranks read from a trace, each with its trace's statistics (its steps are in the rank)."""
        return [(r, r.trace) for r in self.profile.ranks if r.trace is not None]

    @property
    def measured(self) -> bool:
        """Whether per-step measurements exist (a live run or a trace), not only configs and logs."""
        return any(r.steps for r in self.profile.ranks)

    def trace_mean(self, fact: Callable[[TraceStats], float | None]) -> float | None:
        """Mean over the ranks whose trace has it of a fact only a trace knows (``lambda t:
        t.tiny_kernel_frac``); what a live run measures too is in the steps, and the metrics have it."""
        values = [v for t in self.traces if (v := fact(t)) is not None]
        return sum(values) / len(values) if values else None

    @property
    def compute_frac(self) -> float:
        """Share of the step spent in forward + backward + optimizer (1 − data wait when unknown)."""
        m = self.metrics
        parts = (m.forward_frac, m.backward_frac, m.optimizer_frac)
        traced = [
            t.temporal.compute * min(1.0, (t.gpu_util or 1.0) / max(1 - t.temporal.idle, 1e-9))
            for t in self.traces
            if t.temporal is not None
        ]
        if traced:  # GPU compute kernels' share of the step (HTA's compute share, scaled to the step span)
            return min(1.0, sum(traced) / len(traced))
        if all(p is not None for p in parts):
            return min(1.0, sum(p for p in parts if p is not None))
        return max(0.0, 1.0 - (m.data_wait_frac or 0.0))


def severity_for(value: float, high: float, medium: float) -> Severity:
    """'high' at or above ``high``, 'medium' at or above ``medium``, else 'low'."""
    if value >= high:
        return Severity.HIGH
    if value >= medium:
        return Severity.MEDIUM
    return Severity.LOW


def amdahl(fraction: float, factor: float) -> float:
    """Overall speed-up when ``fraction`` of the time gets ``factor``× faster (factor=inf removes it)."""
    fraction = min(max(fraction, 0.0), 1.0)
    remaining = (1.0 - fraction) + (0.0 if factor == float("inf") else fraction / factor)
    return 1.0 / max(remaining, 1e-9)
