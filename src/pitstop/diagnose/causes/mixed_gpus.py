"""mixed_gpus: the ranks of one job run on different GPU models, and every rank waits for the slowest card.

Data parallelism (DDP, FSDP, DeepSpeed, the Trainer) gives every rank the same micro-batch and meets at a
collective every step, so a job on six A100 SXM cards and two A100 PCIe cards runs at the PCIe cards' pace:
the fast ranks finish their compute first and wait at the gradient all-reduce.

Each rank's card comes from its own source (``diagnose/gpu_models.py``): the probe per process, a trace's
``deviceProperties`` per rank, attach per process, nvidia-smi / DCGM logs per GPU. Which card is slower comes
from measurement where each rank's own compute was measured (timed collectives live; a trace's GPU kernel time)
and otherwise from pitstop's hardware table (tensor peak, then memory bandwidth). The cost is the share of the
step the fast ranks wait, bounded by what the slow card's longer compute explains."""

from __future__ import annotations

import dataclasses

from pitstop.core.findings import Finding, use
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, Severity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.diagnose.gpu_models import GpuMix, gpu_mix, rank_span
from pitstop.remedies import advise

MIN_COMPUTE_RATIO = 1.05  # measured: the slow model's ranks compute at least this much longer per step
MEASURED_CONFIDENCE = 0.85  # each rank's own compute measured: the slow card's ranks compute longer
TABLE_CONFIDENCE = 0.6  # only the hardware table says which card is slower; its cost is not measured
UNKNOWN_CONFIDENCE = 0.4  # the models differ, but neither a measurement nor the table says which is slower
LOG_ONLY_CONFIDENCE = 0.45  # ranks known only from GPU logs: the log's GPUs may not all have run this job


@dataclasses.dataclass(frozen=True)
class _Verdict:
    """What the rule found, shared with ``straggler`` (which leaves the slow card's ranks to this cause)."""

    mix: GpuMix
    lost_frac: float | None  # share of the step lost to the slow card, measured
    lost_from: str | None  # how lost_frac was worked out


def _judge(ctx: RuleContext) -> _Verdict | None:
    profile = ctx.profile
    if not ctx.measured:  # GPU logs only: a GPU that never worked did not run this job
        worked = {w.gpu for w in ctx.results.gpus if not w.never_busy}
        profile = dataclasses.replace(profile, ranks=[r for r in profile.ranks if r.rank in worked])
    mix = gpu_mix(profile, ctx.ranks, ctx.metrics.compute_dtype)
    if mix is None:
        return None
    if mix.compute_ratio is not None and mix.compute_ratio < MIN_COMPUTE_RATIO:
        return None  # measured: the slower card's ranks do not compute measurably longer
    wait = mix.others_wait_frac
    excess = mix.compute_excess_frac
    lost: float | None = None
    lost_from = None
    if wait is not None and excess is not None:
        lost = min(wait, excess)
        lost_from = (
            "the faster ranks' wait at collectives, up to the slow card's longer compute"
            if excess < wait
            else "the faster ranks' wait at collectives (the slow card's longer compute accounts for all of it)"
        )
    elif excess is not None:
        lost, lost_from = excess, "the slow card's ranks' longer compute per step"
    elif wait is not None and mix.slow is not None:
        lost, lost_from = wait, "the faster ranks' wait at collectives"
    return _Verdict(mix, lost, lost_from)


def slow_card_ranks(ctx: RuleContext) -> frozenset[int]:
    """The ranks on the slower card when this cause fires and names one: ``straggler`` leaves a rank of
    these, late for its compute, to this cause (one finding for the same seconds)."""
    verdict = _judge(ctx)
    return frozenset(verdict.mix.slow_ranks) if verdict is not None else frozenset()


def _models(mix: GpuMix) -> dict[str, list[int]]:
    return {g.name: list(g.ranks) for g in mix.groups}


def _paper(mix: GpuMix) -> str:
    """What the hardware table says of the two cards, in a clause."""
    if mix.slow is None or mix.fast is None:
        unknown = [g.name for g in mix.groups if g.spec is None]
        if unknown:
            return (
                f"{', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not in pitstop's hardware table"
            )
        return "the hardware table rates the models the same"
    ratio = mix.spec_ratio
    if ratio is not None:
        same = (
            f" (the same {mix.peak_tflops.get(mix.fast.name, 0):,.0f} TFLOP/s {mix.peak_dtype} tensor peak)"
            if ratio[1] == "memory bandwidth" and mix.peak_tflops
            else ""
        )
        return f"on paper the {mix.fast.name} has {ratio[0]:.2f}× the {ratio[1]} of the {mix.slow.name}{same}"
    if mix.slow.spec is None or mix.fast.spec is None:
        return "the hardware table does not know both cards"
    return f"the hardware table rates both as {mix.slow.spec.key}"


def _fast_devices(ctx: RuleContext, mix: GpuMix) -> str | None:
    """The local device indices of the ranks on the faster cards, for CUDA_VISIBLE_DEVICES: only for a job on
    one machine whose ranks' local ranks are known."""
    ranks = [r for r in ctx.profile.ranks if r.rank in set(mix.other_ranks)]
    hosts = {r.hostname for r in ctx.profile.ranks}
    if not ranks or len(hosts) > 1 or ctx.profile.world_size != len(ctx.profile.ranks):
        return None
    locals_ = sorted({r.local_rank for r in ranks})
    if len(locals_) != len(ranks):
        return None  # several ranks on one local index: not a one-machine job's numbering
    return ",".join(map(str, locals_))


@cause(
    CauseId.MIXED_GPUS,
    title="The job mixes GPU models: every rank waits for the slowest card",
    because=(
        "data parallelism gives every rank the same work and meets at a collective every step, so ranks on a "
        "faster GPU model finish first and wait for the ranks on the slower one: the job runs at the slowest "
        "card's pace"
    ),
    needs_gpu=True,
    needs=(Evidence.ALL_RANKS,),
    fires_when=(
        "the ranks of one job name different GPU models (probe, per-rank traces' deviceProperties, attach, "
        "nvidia-smi or DCGM logs: for logs, only the GPUs that worked); silent where each rank's own compute "
        "was measured and the slower model's ranks compute less than {MIN_COMPUTE_RATIO:.2f}× longer. The "
        "slower card is the one measured to compute longer (confidence {MEASURED_CONFIDENCE:.2f}), else the "
        "one with the lower tensor peak or memory bandwidth in pitstop's hardware table "
        "({TABLE_CONFIDENCE:.2f}), else not known ({UNKNOWN_CONFIDENCE:.2f})"
    ),
    estimate=(
        "the faster ranks' measured wait at collectives, up to the slower card's measured extra compute per "
        "step, removed (all cards the faster model, or the work split by speed): 1/(1 − that share). Without a "
        "per-rank measurement: the step's compute share run at the hardware table's ratio of the two cards "
        "(peak or memory bandwidth), an upper bound. Running on the faster cards alone is given beside it"
    ),
    remedies=(RemedyId.MATCH_GPUS,),
)
def mixed_gpus(ctx: RuleContext) -> Finding | None:
    verdict = _judge(ctx)
    if verdict is None:
        return None
    mix = verdict.mix
    lost = verdict.lost_frac
    world = sum(len(g.ranks) for g in mix.groups)
    wait = mix.others_wait_frac
    fast_only = None
    if wait is not None and mix.slow is not None and wait < 1.0:
        fast_only = round(len(mix.other_ranks) / world / (1.0 - wait), 3)
    est, basis = _estimate(ctx, verdict)
    confidence = {"measured": MEASURED_CONFIDENCE, "hardware table": TABLE_CONFIDENCE}.get(
        mix.slower_by or "", UNKNOWN_CONFIDENCE
    )
    if not ctx.measured:
        confidence = min(confidence, LOG_ONLY_CONFIDENCE)
    if lost is not None:
        severity = severity_for(lost, 0.25, 0.10)
    else:
        severity = Severity.MEDIUM if est is not None else Severity.LOW
    evidence = _evidence(mix, lost)
    evidence["fast_cards_only_throughput_ratio"] = fast_only
    slow, fast = mix.slow, mix.fast
    return Finding(
        cause=CauseId.MIXED_GPUS,
        severity=severity,
        confidence=confidence,
        summary=_summary(mix),
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=advise(
            ctx.framework,
            use(
                RemedyId.MATCH_GPUS,
                slow_model=slow.name if slow else None,
                slow_ranks=rank_span(slow.ranks) if slow else None,
                fast_model=fast.name if fast else None,
                fast_ranks=len(mix.other_ranks) if slow else None,
                world_size=world,
                fast_devices=_fast_devices(ctx, mix) if slow else None,
                fast_only_ratio=fast_only,
                models=_listing(mix),
            ),
        ),
    )


def _listing(mix: GpuMix) -> str:
    return " · ".join(f"{rank_span(g.ranks)}: {g.name}" for g in mix.groups)


def _estimate(ctx: RuleContext, verdict: _Verdict) -> tuple[float | None, str]:
    """The speed-up with every card the faster model, and its basis."""
    mix, lost = verdict.mix, verdict.lost_frac
    if lost is not None:
        return amdahl(lost, float("inf")), (
            f"{verdict.lost_from}: {lost:.0%} of the step ({mix.wait_source or mix.compute_source}); with every "
            "card the faster model, or the work split by each card's speed, every rank stops waiting for the "
            "slow one"
        )
    ratio = mix.spec_ratio
    if mix.slow is None:
        return (
            None,
            "not estimated: which card is slower is not known (neither measured per rank nor in the table)",
        )
    if ratio is None:
        return (
            None,
            "not estimated: the hardware table rates the cards the same and nothing was measured per rank",
        )
    if not ctx.measured:
        return None, (
            f"not estimated: no step was measured; the hardware table puts the {ratio[1]} of the "
            f"{mix.fast.name if mix.fast else 'faster card'} at {ratio[0]:.2f}× the {mix.slow.name}'s, "
            "the most the job could gain"
        )
    return amdahl(ctx.compute_frac, ratio[0]), (
        f"not measured per rank: the step's compute share ({ctx.compute_frac:.0%}) run {ratio[0]:.2f}× "
        f"faster, the hardware table's {ratio[1]} ratio of the two cards; an upper bound (a step rarely "
        "scales fully with a card's peak)"
    )


def _summary(mix: GpuMix) -> str:
    slow = mix.slow
    if slow is None:
        return (
            f"The ranks of this job run on different GPU models ({_listing(mix)}); the job runs at the slowest "
            f"card's pace, but which one that is is not known: {_paper(mix)} and nothing was measured per rank."
        )
    others = [g for g in mix.groups if g is not slow]
    on = "; ".join(f"{rank_span(g.ranks)} on {g.name}" for g in others)
    summary = (
        f"{rank_span(slow.ranks).capitalize()} run{'s' if len(slow.ranks) == 1 else ''} on "
        f"{slow.name}, the slower card ({on}): every step runs at its pace"
    )
    one = len(mix.other_ranks) == 1
    wait = mix.others_wait_frac
    if wait is not None:
        summary += (
            f", and the {'rank' if one else 'ranks'} on the faster {'card' if len(others) == 1 else 'cards'} "
            f"wait{'s' if one else ''} {wait:.0%} of each step for it at the collectives"
        )
    else:
        summary += ", and the others wait for it at every collective"
    detail = []
    if mix.compute_ratio is not None:
        fast = mix.fast
        detail.append(
            f"measured, {rank_span(slow.ranks)} compute{'s' if len(slow.ranks) == 1 else ''} "
            f"{mix.compute_ratio:.2f}× longer per step than the {fast.name if fast else 'faster'} "
            f"rank{'s' if fast is None or len(fast.ranks) > 1 else ''} ({mix.compute_source})"
        )
    detail.append(_paper(mix))
    text = "; ".join(detail)
    return f"{summary}. {text[:1].upper()}{text[1:]}."


def _evidence(mix: GpuMix, lost: float | None) -> dict[str, object]:
    wait = mix.others_wait_frac
    return {
        "gpu_models": _models(mix),
        "slow_model": mix.slow.name if mix.slow else None,
        "slow_ranks": list(mix.slow_ranks) or None,
        "fast_model": mix.fast.name if mix.fast else None,
        "slower_by": mix.slower_by,
        "peak_dtype": mix.peak_dtype,
        "peak_tflops": mix.peak_tflops or None,
        "peak_ratio": None if mix.peak_ratio is None else round(mix.peak_ratio, 3),
        "memory_bandwidth_ratio": None if mix.bandwidth_ratio is None else round(mix.bandwidth_ratio, 3),
        "compute_ms_per_rank": {str(k): round(v, 2) for k, v in sorted(mix.compute_ms.items())} or None,
        "compute_source": mix.compute_source,
        "compute_ratio": None if mix.compute_ratio is None else round(mix.compute_ratio, 3),
        "others_wait_frac_of_step": None if wait is None else round(wait, 3),
        "wait_frac_per_rank": {str(k): round(v, 3) for k, v in sorted(mix.wait_frac.items())} or None,
        "wait_source": mix.wait_source,
        "lost_frac_of_step": None if lost is None else round(lost, 3),
    }
