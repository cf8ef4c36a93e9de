"""Cleanup calls in the training loop: ``gc.collect()`` and ``torch.cuda.empty_cache()`` made every step (or
every few), most often memory-leak workarounds copied into a loop or a callback, or the Trainer's
``torch_empty_cache_steps``. Live, the probe wraps both calls (``RankProfile.job_calls``): each is counted per
measured step, timed and attributed to the job's line (or the library's line and the setting that made it).

An explicit ``gc.collect()`` is a full collection: it traverses every tracked object the process keeps alive
(a dataset held as Python lists, the model's modules, the libraries' own), every time. Without it the
interpreter's automatic collections still free the cyclic garbage, mostly in the young generations, so what
the fix removes is the traversal of the survivors; finding and freeing the garbage the calls found stays (each
found object costing ``FOUND_COST`` survivors, as for gc_pauses). A job that switched automatic collection off
has only its calls to collect: there the fix keeps one in ``KEPT_WITHOUT_AUTOMATIC``, and a collection every
few steps is that schedule already, not a finding. ``torch.cuda.empty_cache()`` hands the
caching allocator's free blocks back to the driver (``cudaFree``, which waits for the device), so the next
step allocates them again with ``cudaMalloc``: its cost is the call's host time plus the window's cudaMalloc
calls at an assumed ``ASSUMED_DRIVER_CALL_S`` each (allocator_thrash's figure). On a CPU run it does nothing.
On a GPU the host's lost time costs the step only while the GPU waits, so the share is capped by the GPU's idle
share where it was sampled. When one rank alone makes the call, the others wait for it at the next collective:
the calling rank's share is the job's.

Offline, a configuration that sets the Trainer's ``torch_empty_cache_steps`` (``Environment.empty_cache_steps``)
is named with lower confidence and the share Transformers states for emptying the cache every step, divided by
the interval."""

from __future__ import annotations

from dataclasses import dataclass

from pitstop.core.findings import Finding, use
from pitstop.core.profile import JobCall, RankProfile
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, Source
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.remedies import advise

MOST_STEPS = 0.5  # share of the measured steps a call is made in to count as made every step
MIN_SHARE = 0.03  # share of the step time the fix would take out, for a finding (a call made every step)
PERIODIC_SHARE = 0.10  # the same for a call made every few steps (in fewer than MOST_STEPS of them)
HIGH = 0.20  # that share rated high
MEDIUM = 0.05  # that share rated medium; below it low
CONFIDENCE = 0.9  # calls counted and timed; what automatic collection and cudaMalloc add back is assumed
SAMPLED_CONFIDENCE = 0.7  # attach: the calls and their time read from sampled stacks
CONFIG_STEP_SHARE = 0.10  # emptying the cache every step, of the step: Transformers' "~10% slower"
CONFIG_CONFIDENCE = 0.5  # a configured setting, not measured: its cost depends on the model and the GPU
FOUND_COST = 3.0  # what a garbage object costs a collection, in survivors (gc_pauses' measured figure)
ASSUMED_DRIVER_CALL_S = 1e-3  # one cudaMalloc after the emptied cache; it synchronises (allocator_thrash's)
KEPT_WITHOUT_AUTOMATIC = (
    10  # steps between gc.collect() calls kept when the job disabled automatic collection
)
GC_COLLECT = "gc.collect"  # the calls as the probe names them (JobCall.call)
EMPTY_CACHE = "torch.cuda.empty_cache"  # the same


@dataclass
class Cost:
    """One call site of one rank, with the time the fix would take out of its steps."""

    call: JobCall
    share: float  # of the rank's measured time: the calls' time that goes, and the re-growth for empty_cache
    how: str  # how removed_s was worked out, for the basis


def _gc_part(call: JobCall, tracked: int | None, counted: bool) -> tuple[float, str]:
    """The part of a gc.collect call's time that traversing the survivors takes (the part the fix removes);
    ``counted``: the probe counted what the collections found (attach's samples do not see it)."""
    if not counted:
        return 1.0, (
            "their whole time, an upper bound: what they found, which automatic collection would still find, "
            "is not in sampled stacks"
        )
    found = call.collected / max(call.count, 1)
    if not found:
        return (
            1.0,
            "the collections found no garbage: their whole time is traversing what the job keeps alive",
        )
    if not tracked:
        return 1.0, (
            f"their whole time, an upper bound: they found {found:,.0f} garbage objects each, which automatic "
            "collection would still find (the tracked objects were not counted)"
        )
    part = tracked / (tracked + FOUND_COST * found)
    return part, (
        f"{part:.0%} of their time, traversing the {tracked:,} tracked objects (the {found:,.0f} garbage objects "
        f"each call found, at {FOUND_COST:.0f}× a survivor, would still be found by automatic collection)"
    )


def _costs(ctx: RuleContext, rank: RankProfile) -> list[Cost]:
    """The rank's calls that the rule counts: made every step (or every few, at a cost), worth a share."""
    steps = len(rank.steps)
    wall = max(rank.wall_s, 1e-9)
    gc = rank.gc_pauses
    calls = rank.job_calls or []
    regrow = 0.0
    if ctx.on_gpu and rank.memory.window_device_allocs:
        regrow = rank.memory.window_device_allocs * ASSUMED_DRIVER_CALL_S
    busiest_flush = max((c for c in calls if c.call == EMPTY_CACHE), key=lambda c: c.count, default=None)
    by_hand = gc is not None and gc.enabled is False  # the job's calls are its only collector
    kept = []
    for c in calls:
        every_step = c.steps >= MOST_STEPS * steps
        if c.count < 2:
            continue  # a call made once in the window is not a per-step cleanup
        if c.call == GC_COLLECT and by_hand and not every_step:
            continue  # automatic collection off, a collection every few steps: the advised schedule itself
        if c.call == GC_COLLECT:
            part, how = _gc_part(c, gc.tracked if gc is not None else None, gc is not None)
            removed = c.seconds * part
            if by_hand:
                removed *= 1 - 1 / KEPT_WITHOUT_AUTOMATIC
                how += f"; one call in {KEPT_WITHOUT_AUTOMATIC} kept: automatic collection is off"
        else:
            removed, how = (
                c.seconds,
                "the calls' host time (cudaFree of the cached blocks, waiting for the GPU)",
            )
            if c is busiest_flush and regrow:
                removed += regrow
                how += (
                    f" and the window's {rank.memory.window_device_allocs} cudaMalloc calls, taken as "
                    f"{ASSUMED_DRIVER_CALL_S * 1e3:g} ms each (the allocator re-growing what was emptied)"
                )
        share = removed / wall
        if share >= (MIN_SHARE if every_step else PERIODIC_SHARE):
            kept.append(Cost(c, share, how))
    return kept


def _words(c: JobCall, steps: int) -> str:
    """One call site in a sentence: what, how often, where, how long."""
    made = f"{c.call}() in {c.steps} of {steps} measured steps"
    if c.via:
        who = f"by {c.via}" + (f" ({c.setting})" if c.setting else "")
        where = f"{who}, under {c.site}" if c.site != c.via else who
    else:
        where = f"at {c.site}"
    return f"{made}, {where}, {c.seconds / max(c.count, 1) * 1000:.0f} ms a call"


def _configured(ctx: RuleContext) -> Finding | None:
    """The Trainer's torch_empty_cache_steps read from a configuration, with no live run to measure it."""
    every = ctx.env.empty_cache_steps
    if not every or not ctx.gpu_possible:
        return None
    share = CONFIG_STEP_SHARE / every
    if share < MIN_SHARE:
        return None
    setting = f"TrainingArguments(torch_empty_cache_steps={every})"
    return Finding(
        cause=CauseId.PER_STEP_CLEANUP,
        severity=severity_for(share, HIGH, MEDIUM),
        confidence=CONFIG_CONFIDENCE,
        summary=(
            f"The training configuration sets torch_empty_cache_steps={every}: the Trainer empties the CUDA "
            f"cache every {'step' if every == 1 else f'{every} steps'}, and the allocator has to get the memory "
            "back from the driver on the next one."
        ),
        evidence={
            "setting": setting,
            "empty_cache_steps": every,
            "source": "configuration",
            "configured_by": ctx.env.configured_by.get("empty_cache_steps"),
        },
        est_speedup=amdahl(share, float("inf")),
        speedup_basis=(
            f"Transformers' own figure for emptying the cache every step (about {CONFIG_STEP_SHARE:.0%} of the "
            f"step, huggingface/transformers#31372) over an interval of {every}; not measured: `pitstop doctor` "
            "times the calls"
        ),
        fix=advise(
            ctx.framework,
            use(
                RemedyId.NO_PER_STEP_CLEANUP,
                calls=[{"call": EMPTY_CACHE, "site": None, "via": None, "setting": setting}],
            ),
        ),
    )


@cause(
    CauseId.PER_STEP_CLEANUP,
    title="gc.collect() / empty_cache() in every step",
    because=(
        "the loop collects garbage or empties the CUDA cache by hand every step (a memory-leak workaround, "
        "the Trainer's torch_empty_cache_steps): each full collection traverses every live Python object, "
        "and each emptied cache is allocated again from the driver on the next step"
    ),
    needs_gpu=False,
    needs=((Evidence.PROCESS, Evidence.SETTINGS),),
    fires_when=(
        "the probe's wrappers (or attach's sampled stacks) see gc.collect() or torch.cuda.empty_cache() called in ≥ {MOST_STEPS:.0%} of the "
        "measured steps and the part of their time the fix removes is ≥ {MIN_SHARE:.0%} of the step (≥ "
        "{PERIODIC_SHARE:.0%} for a call made every few steps, unless automatic collection is off and the "
        "calls are its schedule); the job's line is named, or the library's and the setting that made it call. "
        "Offline: torch_empty_cache_steps in a configuration, where its assumed cost reaches the same share"
    ),
    estimate=(
        "1/(1 − share): gc.collect's time less finding the garbage it found (each found object costing "
        "{FOUND_COST:.0f} survivors: automatic collection still finds it; with automatic collection off, one "
        "call in {KEPT_WITHOUT_AUTOMATIC} kept); empty_cache's host time plus the "
        "window's cudaMalloc calls at an assumed {ASSUMED_DRIVER_CALL_S_MS:g} ms each, capped on a GPU by its "
        "idle share; offline, {CONFIG_STEP_SHARE:.0%} of the step (Transformers' figure) over the interval"
    ),
    remedies=(RemedyId.NO_PER_STEP_CLEANUP,),
)
def per_step_cleanup(ctx: RuleContext) -> Finding | None:
    watched = [r for r in ctx.profile.ranks if r.job_calls is not None and r.steps]
    if not watched:
        return _configured(ctx)
    found = {r.rank: (r, costs) for r in watched if (costs := _costs(ctx, r))}
    if not found:
        return None
    worst, costs = max(found.values(), key=lambda rc: (sum(c.share for c in rc[1]), -rc[0].rank))
    steps = len(worst.steps)
    taken = min(sum(c.share for c in costs), 0.95)  # what the calls (and the re-growth) take of the step
    share, cap = taken, ""
    util = ctx.metrics.gpu_util
    if ctx.on_gpu and util is not None and share > 1 - util:
        share = max(0.0, 1 - util)
        cap = f", capped at the GPU's idle share ({1 - util:.0%}): the host's time costs only while it waits"
    world = ctx.profile.world_size
    calling = sorted(found)
    alone = ""
    if world > 1 and len(calling) < world:
        who = ", ".join(str(r) for r in calling)
        alone = (
            f" Only rank{'s' if len(calling) > 1 else ''} {who} make{'' if len(calling) > 1 else 's'} "
            "these calls: the other ranks wait for them at the next collective."
        )
    gc = worst.gc_pauses
    summary = (
        "The training loop cleans up by hand: "
        + "; ".join(_words(c.call, steps) for c in costs)
        + f". {'They take' if len(costs) > 1 else 'It takes'} {taken:.0%} of the measured step time."
        + alone
    )
    evidence: dict[str, object] = {
        "calls": [
            {
                "call": c.call.call,
                "site": c.call.site,
                "via": c.call.via,
                "setting": c.call.setting,
                "count": c.call.count,
                "steps": c.call.steps,
                "seconds": round(c.call.seconds, 4),
                "ms_per_call": round(c.call.seconds / max(c.call.count, 1) * 1000, 2),
                "share": round(c.share, 3),
                "collected": c.call.collected,
            }
            for c in costs
        ],
        "steps": steps,
        "rank": worst.rank,
        "ranks_calling": calling,
        "share": round(share, 3),
        "gc_enabled": gc.enabled if gc is not None else None,
        "tracked": gc.tracked if gc is not None else None,
        "cuda_mallocs": worst.memory.window_device_allocs if ctx.on_gpu else None,
    }
    return Finding(
        cause=CauseId.PER_STEP_CLEANUP,
        severity=severity_for(share, HIGH, MEDIUM),
        confidence=SAMPLED_CONFIDENCE if ctx.profile.source == Source.ATTACH else CONFIDENCE,
        summary=summary,
        evidence=evidence,
        est_speedup=amdahl(share, float("inf")),
        speedup_basis=(
            "the calls taken out of the step: " + "; ".join(f"{c.call.call}: {c.how}" for c in costs) + cap
        ),
        fix=advise(
            ctx.framework,
            use(
                RemedyId.NO_PER_STEP_CLEANUP,
                calls=[
                    {"call": c.call.call, "site": c.call.site, "via": c.call.via, "setting": c.call.setting}
                    for c in costs
                ],
                gc_enabled=gc.enabled if gc is not None else None,
            ),
        ),
    )
