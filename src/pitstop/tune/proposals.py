"""Which remedies tune tries on a job, in which order, and the change it prints for each one it keeps.

Everything about a remedy (the causes it answers, whether it preserves the computation, what it excludes,
its advice) is the remedy's own (``pitstop.remedies``); this module only decides, for one diagnosed job,
which of them can be tried and why each is on the list.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pitstop.core.vocabulary import CauseId, Framework, RemedyId
from pitstop.diagnose import Diagnosis
from pitstop.diagnose.causes import CAUSES
from pitstop.hardware import lookup_gpu
from pitstop.remedies import REGISTRY, Remedy, TrialFacts, remedy


@dataclass(frozen=True)
class Proposal:
    remedy: Remedy
    why: str  # the finding (or the user's request) that put it on the list
    expected: float | None = None  # the speed-up that finding estimates, when it does
    cause: CauseId | None = None  # the finding's cause, when a finding put it on the list

    @property
    def fix(self) -> RemedyId:
        return self.remedy.id


@dataclass(frozen=True)
class Change:
    """What to change to keep a remedy tune measured: its advice, with what the trial actually did."""

    fix: str
    text: str
    snippet: str


def tunable() -> list[RemedyId]:
    """The ids ``--try`` / ``--skip`` / ``--only`` accept."""
    return [rid for rid, r in REGISTRY.items() if r.tunable]


def unknown_fixes(names: list[str]) -> list[str]:
    known = {str(rid) for rid in tunable()}
    return [n for n in names if n not in known]


def trial_facts(diagnosis: Diagnosis) -> TrialFacts:
    env = diagnosis.profile.environment
    gpu = lookup_gpu(env.gpu_name) if env.on_gpu else None
    return TrialFacts(
        on_gpu=env.on_gpu,
        hf_model=env.model.model_type is not None,
        framework=Framework.of(env.framework),
        examples_are_text=env.dataloader.examples_are_text,
        gpu_has_bf16=None if gpu is None else gpu.peak_tflops.get("bf16") is not None,
        gpu_has_tf32=None if gpu is None else gpu.peak_tflops.get("tf32") is not None,
    )


def propose(
    diagnosis: Diagnosis,
    also: list[str] | None = None,
    only: list[str] | None = None,
    skip: list[str] | None = None,
) -> list[Proposal]:
    """Remedies in the order of the findings that call for them (largest estimated saving first), each
    finding's in the registry's order; those the job cannot take are left out."""
    facts = trial_facts(diagnosis)
    env = diagnosis.profile.environment
    picked: dict[RemedyId, Proposal] = {}
    for finding in diagnosis.findings:
        answers = CAUSES[finding.cause].remedies
        for rid, r in REGISTRY.items():
            if r.tunable and rid in answers and rid not in picked and r.cannot_try(facts) is None:
                picked[rid] = Proposal(
                    r, f"{finding.cause} ({finding.severity})", finding.est_speedup, finding.cause
                )
    accumulation = env.grad_accum_steps or 1
    micro = remedy(RemedyId.MICRO_BATCH)
    if accumulation >= 2 and RemedyId.MICRO_BATCH not in picked and micro.cannot_try(facts) is None:
        picked[RemedyId.MICRO_BATCH] = Proposal(micro, f"gradient accumulation of {accumulation}")
    for name in also or []:
        rid = RemedyId(name)
        if rid not in picked:
            picked[rid] = Proposal(remedy(rid), "asked for (--try)")
    chosen = list(picked.values())
    if only:
        chosen = [p for p in chosen if p.fix in only]
    return [p for p in chosen if p.fix not in (skip or [])]


def by_cause_first(proposals: list[Proposal]) -> list[Proposal]:
    """The trial order: each cause's best-ranked fix first, causes in the order of their findings; then each
    cause's second variant, and so on. A budget that runs out has then measured one fix of every cause rather
    than three variants of one (a proposal no finding made is a cause of its own)."""
    groups: dict[str, list[Proposal]] = {}
    for proposal in proposals:
        groups.setdefault(str(proposal.cause or proposal.fix), []).append(proposal)
    rounds = max((len(g) for g in groups.values()), default=0)
    return [g[i] for i in range(rounds) for g in groups.values() if i < len(g)]


def is_variant(proposal: Proposal, before: list[Proposal]) -> bool:
    """Whether a fix of the same cause was tried before it (a second variant, not a new cause)."""
    return proposal.cause is not None and any(p.cause == proposal.cause for p in before)


def exclusive(a: str, b: str) -> bool:
    """Whether two remedies cannot go together (either one says so)."""
    return RemedyId(b) in remedy(a).exclusive_with or RemedyId(a) in remedy(b).exclusive_with


def kept_change(fix: str, framework: str | None, params: Mapping[str, Any] | None = None) -> Change:
    """The change that makes a kept remedy permanent: the same advice a Finding shows, with the parameters
    of what the trial did (``params`` from the trial's report)."""
    advice = remedy(fix).advice(Framework.of(framework), dict(params or {}))
    return Change(str(fix), advice.text, advice.snippet)
