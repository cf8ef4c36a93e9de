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
    CauseId.SLOW_ATTENTION: lambda stack, sources: evidence.eager_attention(stack, sources) is not None,
}
STEP_COUNT_KEYS = {"steps", "steps_per_save"}  # evidence that rests on how many steps were counted
SAMPLED_CONFIDENCE = 0.85  # a share counted from samples, not timed
SAMPLED_CAVEAT = "Sampled, not timed"  # said in the summary of a finding that rests on what stacks showed
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
            seen = _stack_share(finding, view, STACK_EVIDENCE[finding.cause])
            if finding.cause is CauseId.SLOW_ATTENTION and seen is not None:
                _eager_attention(finding, *seen)
        if finding.cause is CauseId.PADDING_WASTE and view.ranks:
            _padding(finding, view)
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


def _stack_share(
    finding: Finding, view: JobView, seen: Callable[[Stack, evidence.Sources], bool]
) -> tuple[Share, RankView] | None:
    """A finding whose records were read from the samples: the share of its rank's samples that show it, with
    its interval, and the confidence of a share counted from samples, not timed. Where the samples show none
    (the finding rests on a setting, an environment variable), only the confidence of the view is kept.
    Returns the share and its rank (None: not seen)."""
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
    return None if best is None else (share, best[1])


def _eager_attention(finding: Finding, share: Share, rank: RankView) -> None:
    """The eager-attention finding says what the samples saw (the functions, their share of the samples and
    of the forward's) and that it was sampled, not timed, in its summary: the config sentence of the rule is
    not what this view knows."""
    sources = evidence.Sources(rank.pid)
    sites = evidence.attention_sites(rank.main.stacks, sources)
    forward = sum(1 for p in rank.phases if p is Phase.FORWARD)
    in_forward = sum(
        1
        for stack, phase in zip(rank.main.stacks, rank.phases, strict=True)
        if phase is Phase.FORWARD and evidence.eager_attention(stack, sources) is not None
    )
    forward_share = Share(in_forward, forward)
    finding.evidence |= {
        "eager_attention_frames": [site for site, _ in sites.most_common(5)],
        "forward_share": round(forward_share.value, 3) if forward else None,
    }
    shown = [f"`{site}`" for site, _ in sites.most_common(2)]
    names = " and ".join(shown) + (" is" if len(shown) == 1 else " are")
    _, _, rest = finding.summary.partition(". ")
    lo, hi = share.interval
    finding.summary = (
        f"Attention runs the eager (unfused) path: {names} in {share.value:.0%} of the sampled stacks "
        f"(95% CI {lo:.0%}–{hi:.0%}, {share.hits}/{share.n} samples"
        + (f"; {forward_share.value:.0%} of the forward's" if forward else "")
        + f") of rank {rank.rank}. {SAMPLED_CAVEAT}: its backward runs in autograd's C++ engine, in no stack."
        + (f" {rest}" if rest else "")
    )
    if finding.est_speedup is None:
        finding.speedup_basis += (
            "; not estimated from samples: a stack times no kernel (`pitstop doctor` times eager against "
            "SDPA at the job's shapes)"
        )


def _padding(finding: Finding, view: JobView) -> None:
    """The padding finding of a sampled view says what showed the padding (the collate's share of the
    samples, the job's ``padding="max_length"`` lines) and that the pad share itself is not known: a stack
    holds no tokens; ``pitstop doctor`` counts it from the batches' masks."""
    found = [(r, evidence.padding_seen(r.main.stacks, evidence.Sources(r.pid))) for r in view.ranks]
    seen = [(r, p) for r, p in found if p is not None]
    if not seen:
        return
    rank, padding = max(seen, key=lambda rp: rp[1].collate_samples)
    collate = Share(padding.collate_samples, len(rank.main.stacks))
    lo, hi = collate.interval
    finding.evidence |= {
        "padding_frac": None,
        "collate": padding.collate,
        "collate_share": round(collate.value, 3) if padding.collate else None,
        "collate_ci95": [round(lo, 3), round(hi, 3)] if padding.collate else None,
        "max_length_padding": [site for site, _ in padding.max_length_lines[:3]],
        "samples": collate.n,
        "sampled_rank": rank.rank,
    }
    said = []
    if padding.max_length_lines:
        site, code = padding.max_length_lines[0]
        said.append(f"the job's code pads every example to max_length (`{code}` at {site})")
    if padding.collate:
        said.append(
            f"`{padding.collate}` collates the batches (in {collate.value:.0%} of the sampled stacks, 95% CI "
            f"{lo:.0%}–{hi:.0%}, {collate.hits}/{collate.n} samples)"
        )
    finding.summary = (
        f"Batches are padded and not packed: {' and '.join(said)}. {SAMPLED_CAVEAT}, and a stack holds no "
        "tokens: the pad share is not known; `pitstop doctor` counts it from the batches' masks."
    )
    finding.speedup_basis = (
        "not estimated: the pad share is in no stack (`pitstop doctor` or `pitstop data stats` counts it)"
    )
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
    eager = any(evidence.attention_sites(r.main.stacks, evidence.Sources(r.pid)) for r in view.ranks)
    notes.append(
        "not seen by sampling: tokens and the pad share (unless a trainer_state.json logs them), the model's "
        "size and dtype" + ("" if eager else ", the attention path (unless its eager function runs)")
    )
    notes += view.window.gpu.notes
    if not view.ranks:
        notes.append("no process of this PID showed a training loop in its main thread during the window")
    return notes + view.notes


def _pct(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.0f}%"
