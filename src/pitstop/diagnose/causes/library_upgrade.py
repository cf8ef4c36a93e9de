"""A library upgrade made the run slower: the same workload ran faster with the versions it had before.

Transformers, torch, DeepSpeed, bitsandbytes, xformers and the rest change defaults and kernels between
releases (the attention or MoE experts implementation a model loads with, activation checkpointing's
``use_reentrant``, ZeRO's buckets, the dequantization kernels), and a run that was fast last week is slower
after a ``pip install -U`` with nothing in the job changed. Only a comparison across the upgrade can see it,
so the history keeps runs of one workload together whatever their versions (versions are no part of the
fingerprint) and hands the previous run of the same workload to the rules as ``RunProfile.baseline``
(``pitstop doctor`` with its history on; ``pitstop history compare`` / ``check`` call ``judge`` on two stored
runs). The rule names the packages whose versions changed, the loss of speed beyond both runs' own noise, and
the phase of the step that grew most: where to look for the default that changed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pitstop.core.findings import Finding, use
from pitstop.core.profile import HistoryRun
from pitstop.core.vocabulary import CauseId, Evidence, Phase, RemedyId
from pitstop.diagnose.causes.base import REGISTRY, cause
from pitstop.diagnose.context import RuleContext, severity_for
from pitstop.remedies import advise

MIN_SLOWDOWN = 0.10  # the smallest loss of speed named: below it, day-to-day drift (clocks, load, data order)
UNMEASURED_SLOWDOWN = 0.20  # the loss needed when either run did not measure its throughput's spread
NOISE_ERRORS = 2.0  # standard errors of the difference of the two runs' rates a loss must exceed
CONFIDENCE = 0.6  # faster with the old versions; other changes (code, data, load) not excluded


def resolvable_drop(spread_a: float | None, spread_b: float | None) -> float | None:
    """The smallest loss of speed two runs' own spreads resolve: NOISE_ERRORS standard errors of the
    difference of their rates (each spread the relative standard error of its real tokens/s); None when
    either run did not measure one. ``history check`` says the same number."""
    spreads = [s for s in (spread_a, spread_b) if isinstance(s, int | float) and s >= 0]
    if len(spreads) < 2:
        return None
    return NOISE_ERRORS * math.hypot(spreads[0], spreads[1])


@dataclass(frozen=True)
class VersionChange:
    package: str
    old: str | None  # None: the package was not loaded in the earlier run
    new: str | None  # None: not loaded in this one

    def __str__(self) -> str:
        return f"{self.package} {self.old or 'not loaded'} → {self.new or 'not loaded'}"


def version_changes(before: Mapping[str, str], after: Mapping[str, str]) -> list[VersionChange]:
    """Every recorded package whose version differs, one loaded in only one of the runs included."""
    names = sorted(set(before) | set(after))
    return [VersionChange(n, before.get(n), after.get(n)) for n in names if before.get(n) != after.get(n)]


@dataclass(frozen=True)
class PhaseDelta:
    phase: Phase
    before_s: float
    after_s: float

    @property
    def delta_s(self) -> float:
        return self.after_s - self.before_s

    @property
    def ratio(self) -> float | None:
        return self.after_s / self.before_s if self.before_s > 0 else None


def phase_seconds(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Seconds per step in each phase of the breakdown, from a run's metrics (``Metrics.to_dict()`` or a stored
    document's ``metrics``): each phase's share of the window times the step time."""
    step = metrics.get("step_time_s")
    if not isinstance(step, int | float) or not math.isfinite(step) or step <= 0:
        return {}
    out: dict[str, float] = {}
    for phase in Phase.breakdown(generation=True):
        frac = metrics.get(f"{phase.value.removesuffix('_s')}_frac")
        if isinstance(frac, int | float) and math.isfinite(frac) and frac >= 0:
            out[phase.value] = float(frac) * float(step)
    return out


def phase_deltas(before: HistoryRun, after: HistoryRun) -> list[PhaseDelta]:
    """The phases both runs timed, in breakdown order."""
    return [
        PhaseDelta(Phase(key), before.phase_s[key], after.phase_s[key])
        for key in (p.value for p in Phase.breakdown(generation=True))
        if key in before.phase_s and key in after.phase_s
    ]


def history_run(metrics: Mapping[str, Any], versions: Mapping[str, str], **where: Any) -> HistoryRun:
    """A run's facts for the comparison from its metrics and versions; ``where``: run_id, created_at, label,
    kind as the history knows them."""

    def number(name: str) -> float | None:
        value = metrics.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value) if math.isfinite(value) and value > 0 else None

    spread = metrics.get("throughput_spread")
    return HistoryRun(
        versions={str(k): str(v) for k, v in versions.items() if v},
        real_tokens_per_s=number("real_tokens_per_s"),
        step_time_s=number("step_time_s"),
        throughput_spread=float(spread) if isinstance(spread, int | float) and spread >= 0 else None,
        phase_s=phase_seconds(metrics),
        **where,
    )


def _speed_ratio(now: HistoryRun, base: HistoryRun) -> tuple[str, float, float, float] | None:
    """(metric, baseline value, this run's value, this run's speed / the baseline's) on real tokens/s where
    both runs have it, else on the step time (the same workload: a step holds the same tokens)."""
    if now.real_tokens_per_s and base.real_tokens_per_s:
        value, ref = now.real_tokens_per_s, base.real_tokens_per_s
        return "real_tokens_per_s", ref, value, value / ref
    if now.step_time_s and base.step_time_s:
        value, ref = now.step_time_s, base.step_time_s
        return "step_time_s", ref, value, ref / value
    return None


def _run_name(run: HistoryRun) -> str:
    said = [run.created_at[:10]] if run.created_at else []
    said += [run.label] if run.label else []
    number = f"run #{run.run_id}" if run.run_id is not None else "the earlier run"
    return f"{number} ({', '.join(said)})" if said else number


def _format(metric: str, value: float) -> str:
    return (
        f"{value:,.0f} real tokens/s" if metric == "real_tokens_per_s" else f"{value * 1000:,.1f} ms a step"
    )


def judge(now: HistoryRun, base: HistoryRun, framework: str | None) -> Finding | None:
    """The finding for ``now`` against ``base``, the earlier run of the same workload: slower beyond the
    noise, with package versions changed between them. Pure: ``pitstop doctor`` reaches it through the rule,
    ``pitstop history compare`` / ``check`` with two stored runs."""
    changes = version_changes(base.versions, now.versions)
    upgraded = [c for c in changes if c.old and c.new]
    if not upgraded:
        return None  # no package changed version: whatever slowed the run, it was not an upgrade
    speed = _speed_ratio(now, base)
    if speed is None:
        return None
    metric, ref, value, ratio = speed
    loss = 1.0 - ratio
    noise = resolvable_drop(now.throughput_spread, base.throughput_spread)
    needed = max(MIN_SLOWDOWN, noise) if noise is not None else UNMEASURED_SLOWDOWN
    if loss <= needed:
        return None
    deltas = phase_deltas(base, now)
    grown = max(deltas, key=lambda d: d.delta_s, default=None)
    worst = grown if grown is not None and grown.delta_s > 0 else None
    est = 1.0 / ratio
    listed = ", ".join(str(c) for c in changes)
    where = ""
    if worst is not None:
        times = f", ×{worst.ratio:.2f}" if worst.ratio is not None else ""
        where = (
            f" The phase that grew most: {worst.phase.label}, {worst.before_s * 1000:,.1f} → "
            f"{worst.after_s * 1000:,.1f} ms a step (+{worst.delta_s * 1000:,.1f} ms{times})."
        )
    noise_said = f"; the two runs' noise resolves {noise:.0%}" if noise is not None else ""
    summary = (
        f"This run is {loss:.0%} slower than {_run_name(base)} of the same workload ({_format(metric, value)} "
        f"against {_format(metric, ref)}{noise_said}), and package versions changed between them: {listed}."
        f"{where}"
    )
    old_versions = ", ".join(f"{c.package} {c.old}" for c in upgraded)
    basis = (
        f"the baseline run #{base.run_id} on {(base.created_at or 'an earlier date')[:10]} with {old_versions}: "
        f"{_format(metric, ref)} against {_format(metric, value)} now; pinning those versions back is assumed to "
        "recover all of it (anything else that changed between the runs would not be recovered)"
    )
    evidence: dict[str, Any] = {
        "baseline_run": base.run_id,
        "baseline_date": base.created_at,
        "baseline_label": base.label,
        "packages_changed": {c.package: f"{c.old} → {c.new}" for c in upgraded},
        "packages_added": {c.package: c.new for c in changes if not c.old},
        "packages_removed": {c.package: c.old for c in changes if not c.new},
        "metric": metric,
        "baseline_value": round(ref, 4),
        "value": round(value, 4),
        "throughput_ratio": round(ratio, 4),
        "slowdown": round(loss, 4),
        "noise": None if noise is None else round(noise, 4),
        "slowest_phase": None if worst is None else worst.phase.label,
        "slowest_phase_delta_ms": None if worst is None else round(worst.delta_s * 1000, 3),
        "slowest_phase_ratio": None if worst is None or worst.ratio is None else round(worst.ratio, 3),
        "phase_deltas_ms": {d.phase.label: round(d.delta_s * 1000, 3) for d in deltas},
    }
    return Finding(
        cause=CauseId.LIBRARY_UPGRADE,
        severity=severity_for(est, 1.25, 1.1),
        confidence=CONFIDENCE,
        summary=summary,
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=advise(
            framework,
            use(
                RemedyId.PIN_VERSIONS,
                changed=[{"package": c.package, "old": c.old, "new": c.new} for c in upgraded],
                phase=None if worst is None else worst.phase.label,
                baseline_run=base.run_id,
            ),
        ),
        title=REGISTRY[CauseId.LIBRARY_UPGRADE].title,  # called without the rule: history compare / check
    )


@cause(
    CauseId.LIBRARY_UPGRADE,
    title="A library upgrade made the run slower",
    because=(
        "a newer Transformers, torch, DeepSpeed, bitsandbytes, xformers (or another library the job loads) "
        "changed a default or a kernel the job relies on (the attention or MoE experts implementation, "
        "checkpointing's use_reentrant, torch.compile, ZeRO's buckets), so the same workload runs slower than it "
        "did with the versions before"
    ),
    needs_gpu=False,
    needs=(Evidence.EARLIER_RUN,),
    fires_when=(
        "the history holds an earlier run of the same workload (the same fingerprint and kind: `pitstop doctor` "
        "with its history on compares with the newest one; `pitstop history compare` / `check` with the runs "
        "named), some recorded package's version differs between the two, and this run is slower on real "
        "tokens/s (else on step time) by more than {MIN_SLOWDOWN:.0%} and more than {NOISE_ERRORS:.0f} standard "
        "errors of the difference of the two runs' rates ({UNMEASURED_SLOWDOWN:.0%} where either did not measure "
        "its spread); confidence {CONFIDENCE:.2f}: other changes between the runs are not excluded"
    ),
    estimate=(
        "the regression ratio: the baseline run's throughput over this run's, what pinning the old versions back "
        "would recover if the upgrade is all that changed"
    ),
    remedies=(RemedyId.PIN_VERSIONS,),
)
def library_upgrade(ctx: RuleContext) -> Finding | None:
    base = ctx.profile.baseline
    if base is None:
        return None
    now = history_run(ctx.metrics.to_dict(), ctx.env.versions)
    return judge(now, base, ctx.framework)
