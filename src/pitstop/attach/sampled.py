"""The diagnosis of a sampled window says it was sampled: the findings that rest on a share of samples carry
that share with its 95% interval and the sample count, and their confidence is lowered (a share from
samples is not a timed measurement; one whose interval reaches below the rule's threshold, more so)."""

from __future__ import annotations

from collections.abc import Callable

from pitstop.attach import evidence
from pitstop.attach.classify import Phase
from pitstop.attach.shares import Share
from pitstop.attach.stacks import Stack
from pitstop.attach.view import JobView, RankView
from pitstop.core.findings import Finding, capped_by_confidence
from pitstop.core.vocabulary import CauseId
from pitstop.diagnose import Diagnosis

SAMPLED = {  # cause -> the phase whose share is its evidence, and the rule's threshold
    CauseId.DATALOADER_BOUND: (Phase.DATA, 0.05),
    CauseId.CHECKPOINT_STALL: (Phase.SAVE, 0.05),
    CauseId.EVAL_OVERHEAD: (Phase.EVAL, 0.10),
    CauseId.COMMUNICATION_BOUND: (Phase.COLLECTIVE, 0.10),
}
# cause -> the samples that are its evidence (a call, compiling, a mode at work): their share is the finding's
STACK_EVIDENCE: dict[CauseId, Callable[[Stack, evidence.Sources], bool]] = {
    CauseId.PER_STEP_CLEANUP: lambda stack, sources: evidence.cleanup_call(stack, sources) is not None,
    CauseId.RECOMPILES: lambda stack, _: evidence.compiling(stack),
    CauseId.DEBUG_MODES: lambda stack, _: evidence.anomaly(stack),
    CauseId.DDP_FIND_UNUSED: evidence.in_ddp_search,
}
STEP_COUNT_KEYS = {"steps", "steps_per_save"}  # evidence that rests on how many steps were counted
SAMPLED_CONFIDENCE = 0.85  # a share counted from samples, not timed
BELOW_THRESHOLD = 0.6  # ... whose interval reaches below where the rule would stay quiet


def _worst(view: JobView, phase: Phase) -> RankView:
    return max(view.ranks, key=lambda r: r.shares[phase].value)


def annotate(diagnosis: Diagnosis, view: JobView) -> Diagnosis:
    for finding in diagnosis.findings:
        finding.evidence["view"] = "sampled"
        if any(not r.steps.resolved for r in view.ranks):  # a figure from a step count that missed steps
            counted = [k for k in finding.evidence if k.endswith("_per_step") or k in STEP_COUNT_KEYS]
            for key in counted:
                finding.evidence[key] = None
            if counted:
                finding.speedup_basis += (
                    "; the sampled step count is a lower bound, so figures per step or per save interval are "
                    "left out and an estimate that uses them is an upper bound"
                )
        if finding.cause in STACK_EVIDENCE and view.ranks:
            _stack_share(finding, view, STACK_EVIDENCE[finding.cause])
        if finding.cause not in SAMPLED or not view.ranks:
            continue
        phase, threshold = SAMPLED[finding.cause]
        rank = _worst(view, phase)
        share = rank.shares[phase]
        lo, hi = share.interval
        finding.evidence |= {
            "sampled_share": round(share.value, 3),
            "sampled_ci95": [round(lo, 3), round(hi, 3)],
            "samples": share.n,
            "sampled_rank": rank.rank,
        }
        factor = SAMPLED_CONFIDENCE * (BELOW_THRESHOLD if lo < threshold else 1.0)
        finding.confidence = round(finding.confidence * factor, 3)
        finding.severity = capped_by_confidence(finding.severity, finding.confidence)
        finding.speedup_basis += f"; sampled: {share.text()} on rank {rank.rank}"
    diagnosis.notes += notes_of(view)
    return diagnosis


def _stack_share(finding: Finding, view: JobView, seen: Callable[[Stack, evidence.Sources], bool]) -> None:
    """A finding whose records were read from the samples: the share of its rank's samples that show it, with
    its interval, and the confidence of a share counted from samples, not timed. Where the samples show none
    (the finding rests on a setting, an environment variable), only the confidence of the view is kept."""
    best: tuple[int, RankView] | None = None
    for rank in view.ranks:
        sources = evidence.Sources(rank.pid)
        hits = sum(1 for stack in rank.main.stacks if seen(stack, sources))
        if hits and (best is None or hits > best[0]):
            best = hits, rank
    if best is not None:
        hits, rank = best
        share = Share(hits, len(rank.main.stacks))
        lo, hi = share.interval
        finding.evidence |= {
            "sampled_share": round(share.value, 3),
            "sampled_ci95": [round(lo, 3), round(hi, 3)],
            "samples": share.n,
            "sampled_rank": rank.rank,
        }
        finding.speedup_basis += f"; sampled: {share.text()} on rank {rank.rank}"
    finding.confidence = round(finding.confidence * SAMPLED_CONFIDENCE, 3)
    finding.severity = capped_by_confidence(finding.severity, finding.confidence)


def notes_of(view: JobView) -> list[str]:
    """What the sampled view saw and what it cannot know, one line each."""
    w = view.window
    notes = [
        f"sampled view: {w.sampler} at {w.rate_hz:g} Hz for {w.seconds:g} s, non-blocking (the job was never "
        f"paused); {w.dropped} torn samples dropped. Shares carry 95% Wilson intervals from N samples (a floor: "
        "successive samples are not independent)"
    ]
    for r in view.ranks:
        shown = ", ".join(
            f"{p.value} {r.shares[p].text()}" for p in Phase if r.shares[p].hits or p is Phase.DATA
        )
        rate = "unknown" if r.step_rate is None else f"~{r.step_rate:.2f}/s"
        if r.step_rate is not None and not r.steps.resolved:
            rate = f"at least {r.step_rate:.2f}/s (steps shorter than the sampling resolves)"
        notes.append(
            f"rank {r.rank} (PID {r.pid}): {shown}; steps: {r.steps.steps} counted from {r.steps.method} "
            f"(estimate), rate {rate}; threads {r.threads}, CPU {_pct(r.cpu_pct)}, "
            f"{r.cores_allowed} cores allowed, {len(r.workers)} DataLoader workers"
            + (f" ({_pct(r.workers_cpu_pct)} CPU)" if r.workers else "")
        )
    rates = [r.step_rate for r in view.ranks if r.step_rate is not None]
    if len(view.ranks) > 1 and rates:
        notes.append(
            f"ranks of a data-parallel job step together: its step rate is at least {max(rates):.2f}/s, the "
            "highest rank's estimate"
        )
    notes.append(
        "not seen by sampling: tokens and padding (unless a trainer_state.json logs them), the model's "
        "size and dtype, attention path"
    )
    notes += view.window.gpu.notes
    if not view.ranks:
        notes.append("no process of this PID showed a training loop in its main thread during the window")
    return notes + view.notes


def _pct(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.0f}%"
