"""What a diagnosis stood on: which kinds of evidence the inputs held (and from what), which they lacked and
why, and so which causes were checked and which could not be. "No finding" then means "checked, and nothing
found": a cause whose evidence was missing is listed as not checked, with the reason, never passed.

Pure: read from the RunProfile alone, so a saved document's profile gives the same answer."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pitstop.core.profile import RankProfile, RunProfile
from pitstop.core.vocabulary import CauseId, Device, Evidence, Source
from pitstop.diagnose.activity import recorded_by_dcgm
from pitstop.diagnose.gpu_models import rank_span

# sources whose ranks were measured by the probe inside the job's own processes
LIVE_SOURCES = frozenset({Source.DOCTOR, Source.TUNE, Source.WATCH, Source.CALLBACK})
NEEDS_GPU = "needs a GPU: this run was on the CPU"  # the reason a GPU-only cause is not checked on a CPU run


class Declared(Protocol):
    """What coverage reads of a cause's declaration (``diagnose.causes.base.Cause``)."""

    @property
    def id(self) -> CauseId: ...

    @property
    def needs(self) -> tuple[Evidence | tuple[Evidence, ...], ...]: ...


@dataclass
class EvidenceState:
    """One kind of evidence: present, with what it is ("3 steps from the trace's ProfilerStep spans"), or
    missing, with why ("the trace has no step spans")."""

    kind: Evidence
    present: bool
    detail: str

    def words(self) -> str:
        return f"{self.kind.label} ({self.detail})"


@dataclass
class CauseCheck:
    """Whether a cause's rule could judge the run; ``why`` says what was missing when it could not."""

    cause: CauseId
    checked: bool
    why: str | None = None
    missing: Evidence | None = None  # the first kind of evidence it lacked (reports group by it)


@dataclass
class Coverage:
    """The evidence a diagnosis had and the causes it could check (the document's ``checks``)."""

    evidence: list[EvidenceState] = field(default_factory=list)
    checks: list[CauseCheck] = field(default_factory=list)

    @property
    def checked(self) -> list[CauseId]:
        return [c.cause for c in self.checks if c.checked]

    @property
    def not_checked(self) -> list[CauseCheck]:
        return [c for c in self.checks if not c.checked]

    def state(self, kind: Evidence) -> EvidenceState | None:
        return next((e for e in self.evidence if e.kind == kind), None)

    def has(self, kind: Evidence) -> bool:
        state = self.state(kind)
        return state is not None and state.present

    @property
    def clean(self) -> bool:
        """Whether "no finding" may read as a clean bill of health: every cause was checked, or the run's
        time was measured (steps) and at most a few causes lacked their evidence."""
        return not self.not_checked or (
            self.has(Evidence.STEPS) and len(self.checked) > len(self.not_checked)
        )

    def reasons(self) -> list[tuple[str, list[CauseId]]]:
        """The not-checked causes grouped by why, the largest group first."""
        groups: dict[str, list[CauseId]] = {}
        for c in self.not_checked:
            state = self.state(c.missing) if c.missing is not None else None
            key = f"{state.kind.label} ({state.detail})" if state is not None else c.why or "no evidence"
            groups.setdefault(key, []).append(c.cause)
        return sorted(groups.items(), key=lambda kv: -len(kv[1]))

    def to_dict(self) -> dict[str, Any]:
        """The ``checks`` section of ``pitstop.run/1``."""
        return {
            "evidence": [{"kind": e.kind, "present": e.present, "detail": e.detail} for e in self.evidence],
            "checked": list(self.checked),
            "not_checked": [{"cause": c.cause, "why": c.why, "missing": c.missing} for c in self.not_checked],
        }

    @classmethod
    def from_dict(cls, saved: Any) -> Coverage | None:
        """A saved ``checks`` section; None where it is missing or unreadable (the caller recomputes). Kinds
        and causes a newer pitstop wrote are left out."""
        if not isinstance(saved, dict):
            return None
        evidence = []
        for e in saved.get("evidence") or []:
            kind = Evidence._value2member_map_.get(e.get("kind")) if isinstance(e, dict) else None
            if isinstance(kind, Evidence):
                evidence.append(EvidenceState(kind, bool(e.get("present")), str(e.get("detail") or "")))
        checks = [CauseCheck(c, True) for c in _causes(saved.get("checked"))]
        for item in saved.get("not_checked") or []:
            cause = CauseId.parse(item.get("cause")) if isinstance(item, dict) else None
            if cause is not None:
                missing = Evidence._value2member_map_.get(item.get("missing"))
                kind = missing if isinstance(missing, Evidence) else None
                checks.append(CauseCheck(cause, False, str(item.get("why") or "") or None, kind))
        order = {c: i for i, c in enumerate(CauseId)}
        checks.sort(key=lambda c: order[c.cause])
        return cls(evidence, checks)


def _causes(saved: Any) -> list[CauseId]:
    found = (CauseId.parse(c) for c in saved) if isinstance(saved, list) else ()
    return [c for c in found if c is not None]


def coverage_of(
    profile: RunProfile,
    causes: Iterable[Declared],
    gpu_only: Sequence[CauseId] = (),
    found: Iterable[CauseId] = (),
) -> Coverage:
    """The evidence ``profile`` holds and, for each cause, whether its ``needs`` are met; ``gpu_only``: the
    causes a CPU run skips (they need a GPU), listed as not checked for that reason; ``found``: causes with a
    finding, checked whatever their declared needs (a rule found another way to its fact)."""
    evidence = [_state(kind, profile) for kind in Evidence]
    by_kind = {e.kind: e for e in evidence}
    skipped, fired = set(gpu_only), set(found)
    checks = []
    for c in causes:
        if c.id in fired:
            checks.append(CauseCheck(c.id, True))
            continue
        if c.id in skipped:
            checks.append(CauseCheck(c.id, False, NEEDS_GPU))
            continue
        missing = next((need for need in c.needs if not _met(need, by_kind)), None)
        if missing is None:
            checks.append(CauseCheck(c.id, True))
        else:
            kinds = missing if isinstance(missing, tuple) else (missing,)
            why = " nor ".join(f"{k.label}: {by_kind[k].detail}" for k in kinds)
            checks.append(CauseCheck(c.id, False, why, kinds[0]))
    return Coverage(evidence, checks)


def _met(need: Evidence | tuple[Evidence, ...], states: dict[Evidence, EvidenceState]) -> bool:
    kinds = need if isinstance(need, tuple) else (need,)
    return any(states[k].present for k in kinds)


# -- each kind of evidence, read from the profile ------------------------------------------------------------


def _state(kind: Evidence, profile: RunProfile) -> EvidenceState:
    present, detail = _READERS[kind](profile)
    return EvidenceState(kind, present, detail)


def _live(profile: RunProfile) -> bool:
    return profile.source in LIVE_SOURCES


def _traced(profile: RunProfile) -> list[RankProfile]:
    return [r for r in profile.ranks if r.trace is not None]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _steps(profile: RunProfile) -> tuple[bool, str]:
    ranks = [r for r in profile.ranks if r.steps]
    if ranks:
        fewest = min(len(r.steps) for r in ranks)
        each = f" on each of {len(ranks)} ranks" if len(ranks) > 1 else ""
        rank = ranks[0]
        if rank.trace is not None:
            reason = rank.step_boundary_reason
            where = f"the trace ({reason})" if reason else "the trace's ProfilerStep spans"
        elif profile.source == Source.ATTACH:
            where = "stack samples"
        elif _live(profile):
            where = "the probe's timing"
        else:
            where = "the inputs"
        return True, f"{_plural(fewest, 'step')}{each} from {where}"
    if _traced(profile):
        return False, "the trace has no step spans (no ProfilerStep#N), so no step time to divide"
    if _live(profile) or profile.source == Source.ATTACH:
        return False, "the job ended before a measured step"
    if any(r.gpu_samples or r.gpu_activity for r in profile.ranks):
        return False, "a GPU log times no training steps"
    return False, "configs and logs time no steps"


def _utilization(profile: RunProfile) -> tuple[bool, str]:
    sampled = [r for r in profile.ranks if any(s.util is not None for s in r.gpu_samples)]
    traced = [r for r in _traced(profile) if r.trace is not None and r.trace.gpu_util is not None]
    counted = [
        r
        for r in profile.ranks
        if r.gpu_activity is not None
        and any(
            s.gr_active is not None or s.util is not None or s.sm_active is not None
            for s in r.gpu_activity.samples
        )
    ]
    found = []
    if sampled:
        dcgm = any(recorded_by_dcgm(r) for r in sampled)
        log = "sampled by NVML" if _live(profile) else "a DCGM recording" if dcgm else "an nvidia-smi log"
        found.append(f"{log}, {_plural(len(sampled), 'GPU')}")
    if traced:
        found.append(f"the trace's kernels, {_plural(len(traced), 'rank')}")
    if counted:
        source = counted[0].gpu_activity.source if counted[0].gpu_activity else "DCGM"
        found.append(f"{source} counters, {_plural(len(counted), 'GPU')}")
    if found:
        return True, "from " + "; ".join(found)
    if profile.environment.device == Device.CPU:
        return False, "a CPU run"
    if any(r.gpu_samples for r in profile.ranks):
        return False, "the GPU log has no utilization column"
    if _traced(profile):
        return False, "the trace holds no GPU kernels"
    if _live(profile):
        return False, "NVML could not sample the GPU"
    return False, "no trace, nvidia-smi log or DCGM recording among the inputs"


ACTIVITY_WORDS = {
    "sm_active": "SM",
    "tensor_active": "tensor",
    "dram_active": "DRAM",
    "sm_occupancy": "occupancy",
}


def _activity(profile: RunProfile) -> tuple[bool, str]:
    recorded = [
        r.gpu_activity for r in profile.ranks if r.gpu_activity is not None and r.gpu_activity.samples
    ]
    fields = [
        word
        for name, word in ACTIVITY_WORDS.items()
        if any(getattr(s, name) is not None for a in recorded for s in a.samples)
    ]
    if fields:
        return (
            True,
            f"{', '.join(fields)} activity from {recorded[0].source}, {_plural(len(recorded), 'GPU')}",
        )
    if recorded:
        return False, f"the {recorded[0].source} recording has no SM, tensor or DRAM counters"
    if profile.environment.device == Device.CPU:
        return False, "a CPU run"
    return False, "no DCGM or GPM counters were read"


def _memory(profile: RunProfile) -> tuple[bool, str]:
    allocator = [r for r in profile.ranks if r.memory.peak_reserved is not None or r.memory.peak_allocated]
    logged = [r for r in profile.ranks if any(s.mem_used is not None for s in r.gpu_samples)]
    if allocator:
        return True, f"the allocator's counters, {_plural(len(allocator), 'rank')}"
    if logged:
        return (
            True,
            f"{'NVML' if _live(profile) else 'the GPU log'}'s memory used, {_plural(len(logged), 'GPU')}",
        )
    if profile.environment.device == Device.CPU:
        return False, "a CPU run"
    return False, "no allocator counters or memory column in the inputs"


def _kernels(profile: RunProfile) -> tuple[bool, str]:
    traced = _traced(profile)
    with_gpu = [r for r in traced if r.trace is not None and r.trace.temporal is not None]
    if with_gpu:
        return True, _plural(len(with_gpu), "trace")
    if traced:
        return False, "the trace holds no GPU events"
    return False, "no profiler trace among the inputs" if not _live(
        profile
    ) else "the probe times steps, not kernels"


def _collectives(profile: RunProfile) -> tuple[bool, str]:
    if profile.world_size <= 1:
        return True, "one process: nothing to communicate"
    timed = [r for r in profile.ranks if r.collectives]
    if timed:
        return True, f"timed collectives of {_plural(len(timed), 'rank')}"
    nccl = [r for r in _traced(profile) if r.trace is not None and r.trace.nccl_ms]
    if nccl:
        return True, f"NCCL / RCCL kernels in {_plural(len(nccl), 'trace')}"
    if _traced(profile):
        return False, "the traces hold no NCCL or RCCL kernels"
    return False, "no trace or timed collectives"


def _all_ranks(profile: RunProfile) -> tuple[bool, str]:
    world = profile.world_size
    if world <= 1:
        return True, "one process"
    measured = [r.rank for r in profile.ranks if r.steps or r.trace is not None or r.gpu_samples]
    missing = profile.missing_ranks or []
    if len(measured) >= world and not missing:
        return True, f"all {world}: {rank_span(measured)}"
    if not measured:
        return False, f"none of {world} ranks measured"
    others = "traces" if _traced(profile) else "measurements"
    why = (
        f"ranks {', '.join(map(str, missing[:8]))} did not report"
        if missing
        else f"the other ranks' {others} were not given"
    )
    return False, f"{len(measured)} of {world} ({rank_span(measured)}): {why}"


def _loader(profile: RunProfile) -> tuple[bool, str]:
    if not any(r.steps for r in profile.ranks):
        return False, "no steps to time it in"
    if _live(profile):
        return True, "the DataLoader's waits timed by the probe"
    if profile.source == Source.ATTACH:
        return True, "DataLoader frames in the stack samples"
    traces = [r.trace for r in _traced(profile) if r.trace is not None]
    if any(
        (t.breakdown_ms is not None and t.breakdown_ms.dataloader > 0)
        or t.dataloader_multiprocess is not None
        for t in traces
    ):
        return True, "the trace's DataLoader spans"
    if traces:
        return False, "the trace has no DataLoader spans: data wait unknown"
    return False, "the inputs do not time the DataLoader"


def _process(profile: RunProfile) -> tuple[bool, str]:
    watched = [
        r
        for r in profile.ranks
        if r.job_calls is not None or r.gc_pauses is not None or r.debug_modes is not None
    ]
    if watched or _live(profile):
        return True, "the probe inside the job"
    if profile.source == Source.ATTACH:
        return False, "attach samples the job from outside: its calls and counters are not seen"
    return False, "pitstop read files and did not run inside the job (`pitstop doctor` does)"


def _settings(profile: RunProfile) -> tuple[bool, str]:
    env = profile.environment
    if _live(profile):
        return True, "seen by the probe"
    if env.config_sources:
        names = [s.rsplit("/", 1)[-1] for s in env.config_sources]
        return True, ", ".join(names[:4]) + (", …" if len(names) > 4 else "")
    if env.framework or profile.totals is not None:
        return True, "the inputs name the framework"
    return False, "no config, TrainingArguments or live process gave them"


def _clocks(profile: RunProfile) -> tuple[bool, str]:
    clocked = [
        r
        for r in profile.ranks
        if any(s.sm_clock is not None or s.clock_reasons is not None for s in r.gpu_samples)
    ]
    if clocked:
        return True, f"{'NVML' if _live(profile) else 'the GPU log'}, {_plural(len(clocked), 'GPU')}"
    if profile.environment.device == Device.CPU:
        return False, "a CPU run"
    if any(r.gpu_samples for r in profile.ranks):
        return False, "the GPU log has no clock or throttle-reason column"
    return False, "no NVML samples or nvidia-smi log with clocks"


def _model_size(profile: RunProfile) -> tuple[bool, str]:
    model = profile.environment.model
    if model.params_total:
        return True, f"{model.params_total / 1e6:,.1f}M parameters"
    return False, "the model's parameter count is unknown (`pitstop analyze --model config.json` gives it)"


def _earlier_run(profile: RunProfile) -> tuple[bool, str]:
    if profile.baseline is not None:
        return (
            True,
            f"run {profile.baseline.run_id} of the history" if profile.baseline.run_id else "the history's",
        )
    return False, "no earlier run of this job in the history"


_READERS = {
    Evidence.STEPS: _steps,
    Evidence.GPU_UTILIZATION: _utilization,
    Evidence.GPU_ACTIVITY: _activity,
    Evidence.GPU_MEMORY: _memory,
    Evidence.TRACE_KERNELS: _kernels,
    Evidence.COLLECTIVES: _collectives,
    Evidence.ALL_RANKS: _all_ranks,
    Evidence.LOADER_TIMING: _loader,
    Evidence.PROCESS: _process,
    Evidence.SETTINGS: _settings,
    Evidence.GPU_CLOCKS: _clocks,
    Evidence.MODEL_SIZE: _model_size,
    Evidence.EARLIER_RUN: _earlier_run,
}


# -- the report's words: every renderer says the same ----------------------------------------------------------


def checked_line(coverage: Coverage) -> str:
    """One line: how many causes were checked, on what evidence ("Checked 18 of 36 causes on step timing (3
    steps from the trace's ProfilerStep spans), GPU utilization (from the trace's kernels, 1 rank)")."""
    total = len(coverage.checks)
    on = [e.words() for e in coverage.evidence if e.present and e.kind != Evidence.ALL_RANKS]
    ranks = coverage.state(Evidence.ALL_RANKS)
    if ranks is not None and ranks.present and ranks.detail != "one process":
        on.append(f"ranks ({ranks.detail})")
    evidence = f" on {', '.join(on)}" if on else " (no evidence of the run's time was read)"
    return f"{len(coverage.checked)} of {total} causes{evidence}"


def not_checked_line(coverage: Coverage) -> str | None:
    """One line: the causes not checked, grouped by why; None when every cause was checked."""
    groups = coverage.reasons()
    if not groups:
        return None
    return "; ".join(f"{why}: {', '.join(causes)}" for why, causes in groups)


def no_finding_line(coverage: Coverage) -> str:
    """The verdict when no rule fired: what was checked, and what was not and why. A run whose inputs could
    not be analysed (no step timing) is never called clean."""
    n, skipped = len(coverage.checked), len(coverage.not_checked)
    if skipped == 0:
        return f"No finding among the {n} causes checked: nothing in this run points to a known cause of slowness."
    because = "; ".join(f"{why} ({len(causes)})" for why, causes in coverage.reasons())
    if not coverage.clean:
        return (
            f"No finding among the {n} causes checked, but this is not a clean bill of health: {skipped} could "
            f"not be checked: {because}."
        )
    return f"No finding among the {n} causes checked; not checked: {because}."


def inputs_line(profile: RunProfile) -> str | None:
    """What ``analyze`` read, by kind ("8 traces (ranks 0-7)", "an nvidia-smi log of 2 GPUs · 2 configs");
    None where the profile does not tell (the caller counts the paths given)."""
    parts = []
    traced = _traced(profile)
    if len(traced) == 1:
        parts.append("1 trace")
    elif traced:
        parts.append(f"{len(traced)} traces ({rank_span([r.rank for r in traced])})")
    logged = [r for r in profile.ranks if r.trace is None and r.gpu_samples]
    if logged:
        parts.append(f"a GPU log of {_plural(len(logged), 'GPU')}")
    counted = [r.gpu_activity for r in profile.ranks if r.gpu_activity is not None]
    if counted:
        parts.append(f"{counted[0].source} counters of {_plural(len(counted), 'GPU')}")
    configs = profile.environment.config_sources
    if configs:
        parts.append(_plural(len(configs), "config"))
    return " · ".join(parts) or None
