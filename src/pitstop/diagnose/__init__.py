"""Rules turn a RunProfile into ranked Findings. Pure: no measuring, no printing, no torch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from pitstop import schemas
from pitstop.core.findings import Finding, rank_findings
from pitstop.core.profile import CountSource, RunProfile, StepBoundary, to_jsonable
from pitstop.core.vocabulary import CauseId, Device, Source
from pitstop.diagnose.context import RuleContext
from pitstop.diagnose.cost import RunCost, run_cost
from pitstop.diagnose.coverage import Coverage, coverage_of
from pitstop.diagnose.gpu_models import gpu_models_table
from pitstop.diagnose.gpu_windows import describe_stretches
from pitstop.diagnose.metrics import Metrics
from pitstop.diagnose.ranks import RanksAnalysis, Scaling
from pitstop.diagnose.results import RunResults, results_of
from pitstop.diagnose.savings import add_savings
from pitstop.display import html_of
from pitstop.version import __version__

# measured steps from which a finding keeps its rule's confidence: fewer scale every finding's confidence by
# steps / FULL_CONFIDENCE_STEPS (2 steps: × 0.4), since a mean of so few steps can be one odd step
FULL_CONFIDENCE_STEPS = 5
# the sources whose evidence is the probe's window of steps; a trace's kernels, a log's totals or attach's
# stack samples stand on more than the steps they were cut into
STEP_WINDOW_SOURCES = frozenset({Source.DOCTOR, Source.TUNE, Source.WATCH, Source.CALLBACK})


@dataclass
class Diagnosis:
    profile: RunProfile
    metrics: Metrics
    findings: list[Finding]
    skipped_checks: list[CauseId] = field(default_factory=list)  # causes that need a GPU on a CPU run
    notes: list[str] = field(default_factory=list)
    # per-rank rows, per-step series, GPU windows and the rank shown; computed from the profile when not given
    results: RunResults = None  # type: ignore[assignment]
    ranks_analysis: RanksAnalysis | None = None  # with timed collectives: who waits for whom
    scaling: Scaling | None = None
    cost: RunCost | None = None  # with a price per GPU-hour (add_savings): per hour, per million real tokens
    # the evidence the rules stood on and the causes they could check; computed from the profile when not given
    coverage: Coverage = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.results is None:
            self.results = results_of(self.profile)
        if self.coverage is None:
            from pitstop.diagnose.causes import CAUSES

            found = [f.cause for f in self.findings]
            self.coverage = coverage_of(self.profile, CAUSES.values(), self.skipped_checks, found)

    def _repr_html_(self) -> str | None:
        """In a notebook, a Diagnosis shows itself as the HTML report."""
        return html_of(self)

    def add_savings(self, price: float | None, total_steps: int | None = None) -> None:
        """What the run costs at ``price`` and each finding's saving over the rest of the run (in place), or
        the one note that says why no saving could be given: the one place doctor, analyze, attach, watch and
        the callbacks get them, so every report shows the same figures."""
        note = add_savings(self.findings, self.profile, self.metrics, price, total_steps)
        if note is not None:
            self.notes.append(note)
        self.cost = run_cost(self.profile, self.metrics, price)

    def environment_table(self) -> dict[str, Any]:
        """What was known about the setup, flat enough for a table (the document's ``environment``)."""
        env = self.profile.environment
        return {
            "device": env.device,
            "gpu_name": env.gpu_name,
            # model -> its ranks: the lowest rank's name (gpu_name) hides a mix
            "gpu_models": gpu_models_table(self.profile),
            "gpu_count": env.gpu_count,
            "gpus_held": env.gpus_held,
            "framework": env.framework,
            "attn_implementation": env.attention.implementation,
            "counted": counting_line(self.profile),
            "step": step_line(self.profile, self.metrics),
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
        return {
            "schema": schemas.RUN,
            "pitstop_version": __version__,
            "source": self.profile.source,
            "command": self.profile.command,
            "exit_code": self.profile.exit_code,
            "failure": self._failure(),
            "findings": [f.to_dict() for f in self.findings],
            "metrics": self.metrics.to_dict(),
            "environment": self.environment_table(),
            **self.results.to_dict(),  # ranks, step_series, gpu_windows, shown_rank
            "ranks": self._ranks(),
            "scaling": None if self.scaling is None else self.scaling.to_dict(),
            "communication": self._communication(),
            "missing_ranks": self.profile.missing_ranks,
            "missing_hosts": self.profile.missing_hosts,
            "skipped_checks": self.skipped_checks,
            "checks": self.coverage.to_dict(),
            "notes": self.notes + self.profile.notes,
            "cost": None if self.cost is None else self.cost.to_dict(),
            "profile": self.profile.to_dict(),
        }

    def _failure(self) -> dict[str, Any] | None:
        """How the job failed (its exit, its exception) and the report's lead line for it; None: it did not."""
        failure = self.profile.failure
        if failure is None:
            return None
        return {**to_jsonable(failure), "summary": failure_line(self.profile)}

    def _ranks(self) -> list[dict[str, Any]]:
        """Per-rank figures; with timed collectives, each rank's waiting, communication and arrival skew."""
        comm = {} if self.ranks_analysis is None else {r.rank: r for r in self.ranks_analysis.ranks}
        rows = []
        for metrics in self.results.ranks:
            row: dict[str, Any] = to_jsonable(metrics)
            c = comm.get(metrics.rank)
            if c is not None:
                row |= {
                    "host": c.host,
                    "wait_s": c.wait_s,
                    "comm_s": c.comm_s,
                    "own_compute_s": c.compute_s,
                    "collectives_per_step": c.collectives_per_step,
                    "collective_bytes_per_step": c.bytes_per_step,
                    "arrival_late_s": c.late_s,
                    "arrived_last_frac": c.last_frac,
                    "clock_offset_s": c.clock_offset_s,
                }
            rows.append(row)
        return rows

    def _communication(self) -> dict[str, Any] | None:
        a = self.ranks_analysis
        if a is None:
            return None
        return {
            "matched_collectives": a.matched,
            "arrival_skew_s": a.skew_s,
            "straggler": a.straggler,
            "straggler_last_frac": a.straggler_last_frac,
            "persistent": a.persistent,
            "clock": a.clock,
            "bandwidth": [vars(b) for b in a.bandwidth],
        }


def diagnose(profile: RunProfile) -> Diagnosis:
    from pitstop.diagnose.causes import CAUSES, RULES

    ctx = RuleContext.of(profile)
    for rule in RULES:
        finding = rule(ctx)
        if finding is not None:
            ctx.earlier.append(finding)
    skipped = []
    if ctx.env.device == Device.CPU:
        # timed collectives show communication on any device
        live = {CauseId.COMMUNICATION_BOUND} if ctx.ranks is not None else set()
        skipped = [c.id for c in CAUSES.values() if c.needs_gpu and c.id not in live]
    notes = []
    for rank in profile.ranks:
        notes += [f"rank {rank.rank}: {e}" for e in rank.probe_errors]
    for window in ctx.results.gpus:
        notes += describe_stretches(window)
    findings, scaled = confidence_by_steps(ctx.earlier, measured_steps(profile))
    if scaled is not None:
        notes.append(scaled)
    return Diagnosis(
        profile, ctx.metrics, rank_findings(findings), skipped, notes, ctx.results, ctx.ranks, ctx.scaling
    )


def measured_steps(profile: RunProfile) -> int | None:
    """The steps the diagnosis stands on: the fewest of any rank the probe measured some on; None where the
    evidence is not a window of steps (a trace, a log, stack samples: ``STEP_WINDOW_SOURCES``)."""
    if profile.source not in STEP_WINDOW_SOURCES:
        return None
    counts = [len(r.steps) for r in profile.ranks if r.steps]
    return min(counts) if counts else None


def confidence_by_steps(findings: list[Finding], steps: int | None) -> tuple[list[Finding], str | None]:
    """Confidence follows the steps measured: under ``FULL_CONFIDENCE_STEPS`` every finding's confidence is
    multiplied by steps / FULL_CONFIDENCE_STEPS (its severity capped again by it), and one note says so."""
    if steps is None or steps >= FULL_CONFIDENCE_STEPS or not findings:
        return findings, None
    factor = steps / FULL_CONFIDENCE_STEPS
    scaled = [dataclasses.replace(f, confidence=f.confidence * factor) for f in findings]
    note = (
        f"only {steps} step{'s' if steps != 1 else ''} measured: every finding's confidence is scaled by "
        f"{steps}/{FULL_CONFIDENCE_STEPS} (full confidence from {FULL_CONFIDENCE_STEPS} measured steps)"
    )
    return scaled, note


def failure_line(profile: RunProfile) -> str | None:
    """The line every report leads with when the job failed ("The job failed at step 3: RuntimeError: the
    callback failed (train.py:78)"); None when it did not."""
    failure = profile.failure
    if failure is None:
        return None
    on_rank = f" on rank {failure.rank}" if failure.rank is not None and profile.world_size > 1 else ""
    if failure.exception is not None:
        at = f"at step {failure.step}" if failure.step is not None else "before its first step"
        return f"The job failed {at}{on_rank}: {failure.describe()}"
    last = max((r.steps[-1].index for r in profile.ranks if r.steps), default=None)
    after = f" after step {last}" if last is not None else ""
    if failure.signal is not None:
        how = f"was killed by {failure.signal}"
    elif failure.exit_code is not None:
        how = f"exited with code {failure.exit_code}"
    else:
        how = "failed"
    return f"The job {how}{after}{on_rank}"


def step_line(profile: RunProfile, metrics: Metrics) -> str | None:
    """What one optimizer step holds and the rate in steps, in one line ("1 step = 4 micro-batches × 8 samples
    on each of 2 ranks = 64 samples, 16,384 tokens · 18.5 steps/s"): a rate is read in its unit, so an it/s that
    fell because each step grew (more accumulation, more ranks) reads as such. None where steps were not
    counted (offline sources without per-step records)."""
    m = metrics
    if (
        m.step_time_s is None
        or not m.micro_batches_per_step
        or profile.source in (Source.ANALYZE, Source.CHECK)
    ):
        return None
    measured = len([r for r in profile.ranks if r.steps])
    world = profile.world_size
    micro = f"{m.micro_batches_per_step:.3g} micro-batch{'es' if m.micro_batches_per_step != 1 else ''}"
    if m.samples_per_step and measured:
        per_micro = m.samples_per_step / measured / m.micro_batches_per_step
        micro += f" × {per_micro:.3g} samples"
    where = f" on each of {world} ranks" if world > 1 else ""
    held = [f"{m.samples_per_step:,.0f} samples"] if m.samples_per_step else []
    if m.tokens_per_step:
        real = m.real_tokens_per_step
        padded = f" ({real:,.0f} real)" if real is not None and real < m.tokens_per_step * 0.995 else ""
        held.append(f"{m.tokens_per_step:,.0f} tokens{padded}")
    total = f" = {', '.join(held)}" if held else ""
    if measured < world and held:
        total += f" on the {measured} rank{'s' if measured != 1 else ''} measured"
    return f"1 step = {micro}{where}{total} · {1.0 / m.step_time_s:,.3g} steps/s"


_COUNTED_FROM = {
    CountSource.DATALOADER: "DataLoader batches",
    CountSource.MODEL_INPUTS: "the model's forward inputs (the loop builds its own batches: that time is 'other', "
    "not data wait)",
    CountSource.UNKNOWN: "nothing (neither the DataLoader's batches nor the model's inputs carried rows or tokens)",
}
_DELIMITED_BY = {StepBoundary.OPTIMIZER_STEP: "optimizer step", StepBoundary.MODEL_FORWARD: "next forward"}


def counting_line(profile: RunProfile) -> str | None:
    """Where the lowest measured rank's rows and tokens were counted and what delimited its steps, in one line
    ("counted from DataLoader batches · steps: optimizer step"); None where the source does not say (offline
    inputs, older profiles). A sampled ``pitstop attach`` view says where its steps came from in the stacks
    and that tokens are unknown unless a log of the job's was read."""
    rank = next((r for r in profile.ranks if r.steps), None)
    if rank is None or (rank.tokens_counted_from is None and rank.steps_delimited_by is None):
        return None
    sampled = (rank.step_boundary_reason or "").removeprefix("sampled: ")
    if profile.source == Source.ATTACH and sampled != (rank.step_boundary_reason or ""):
        # pitstop attach's sampled view: steps were found in stacks, and tokens are in no stack
        method, _, bound = sampled.partition(", ")
        where = (
            "optimizer-step frames in the sampled stacks"
            if method == StepBoundary.OPTIMIZER_STEP
            else "forward/backward cycles in the sampled stacks (one per micro-batch)"
        )
        tokens = (
            "tokens from the job's trainer_state.json"
            if profile.totals is not None and profile.totals.tokens is not None
            else "tokens unknown (not in a stack, and no log of the job's was read)"
        )
        return f"steps from {where}{' (a lower bound)' if bound else ''} · {tokens}"
    source = rank.tokens_counted_from
    boundary = rank.steps_delimited_by
    counted = _COUNTED_FROM.get(source, "unknown") if source is not None else "unknown"
    steps = _DELIMITED_BY.get(boundary, "unknown") if boundary is not None else "unknown"
    if boundary == StepBoundary.MODEL_FORWARD and rank.step_boundary_reason:
        steps += f" ({rank.step_boundary_reason})"
    return f"counted from {counted} · steps: {steps}"
