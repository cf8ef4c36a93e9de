"""Rules turn a RunProfile into ranked Findings. Pure: no measuring, no printing, no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pitstop import schemas
from pitstop.catalogue import CAUSES
from pitstop.diagnose.context import RuleContext
from pitstop.diagnose.gpu_windows import describe_stretches
from pitstop.diagnose.metrics import Metrics
from pitstop.diagnose.results import RunResults, results_of
from pitstop.findings import Finding, rank_findings
from pitstop.profile import RunProfile


@dataclass
class Diagnosis:
    profile: RunProfile
    metrics: Metrics
    findings: list[Finding]
    skipped_checks: list[str] = field(default_factory=list)  # causes that need a GPU on a CPU run
    notes: list[str] = field(default_factory=list)
    # per-rank rows, per-step series, GPU windows and the rank shown; computed from the profile when not given
    results: RunResults = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.results is None:
            self.results = results_of(self.profile)

    def _repr_html_(self) -> str:
        """In a notebook, a Diagnosis shows itself as the HTML report."""
        import pitstop

        return pitstop._html_of(self)

    def environment_table(self) -> dict[str, Any]:
        """What was known about the setup, flat enough for a table (the document's ``environment``)."""
        env = self.profile.environment
        return {
            "device": env.device,
            "gpu_name": env.gpu_name,
            "gpu_count": env.gpu_count,
            "framework": env.framework,
            "attn_implementation": env.attention.implementation,
            "attention": vars(env.attention),
            "param_dtype": env.param_dtype,
            "autocast_dtype": env.autocast_dtype,
            "tf32": env.tf32,
            "gradient_checkpointing": env.gradient_checkpointing,
            "dataloader": vars(env.dataloader),
            "micro_batch_size": env.micro_batch_size,
            "grad_accum_steps": env.grad_accum_steps,
            "offload": env.offload,
            "zero_stage": env.zero_stage,
            "world_size": self.profile.world_size,
            "model": vars(env.model),
            "cpu_count": env.cpu_count,
            "versions": env.versions,
        }

    def to_dict(self) -> dict[str, Any]:
        """The stable ``pitstop.run/1`` document."""
        from pitstop import __version__

        return {
            "schema": schemas.RUN,
            "pitstop_version": __version__,
            "source": self.profile.source,
            "command": self.profile.command,
            "exit_code": self.profile.exit_code,
            "findings": [f.to_dict() for f in self.findings],
            "metrics": self.metrics.to_dict(),
            "environment": self.environment_table(),
            **self.results.to_dict(),  # ranks, step_series, gpu_windows, shown_rank
            "skipped_checks": self.skipped_checks,
            "notes": self.notes + self.profile.notes,
            "profile": self.profile.to_dict(),
        }


def diagnose(profile: RunProfile) -> Diagnosis:
    from pitstop.diagnose.rules import RULES

    ctx = RuleContext.of(profile)
    for rule in RULES:
        finding = rule(ctx)
        if finding is not None:
            ctx.earlier.append(finding)
    skipped = []
    if ctx.env.device == "cpu":
        skipped = [c.id for c in CAUSES.values() if c.needs_gpu]
    notes = []
    for rank in profile.ranks:
        notes += [f"rank {rank.rank}: {e}" for e in rank.probe_errors]
    for window in ctx.results.gpus:
        notes += describe_stretches(window)
    return Diagnosis(profile, ctx.metrics, rank_findings(ctx.earlier), skipped, notes, ctx.results)
