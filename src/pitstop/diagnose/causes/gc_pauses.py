"""gc_pauses: Python's cyclic garbage collector stalls the training loop.

Live, the probe times every collection in the measured window, per generation (``RankProfile.gc_pauses``),
so the share is measured. A full (generation-2) collection traverses every tracked object the job keeps
alive: millions of them (a tokenized dataset held as Python lists, big dicts of metadata) make each one a
long pause inside some step. The fix freezes what setup built, switches automatic collection off and runs a
full ``gc.collect()`` every N steps, which then traverses only what was made since: it removes the survivors'
traversal, and with automatic collection off the young generations' collections stop too, while finding,
clearing and freeing the garbage the collections found stays (the manual ones find it). So the estimate
splits each full collection's time between the tracked objects (counted after the window) and the objects it
found, at ``FOUND_COST`` survivors each, and adds the young generations' time.
``gc.freeze()`` alone is not the fix for the time: CPython (3.13 and before) starts a full collection once
the objects promoted since the last one exceed a quarter of those it kept, so with fewer objects to traverse
the collections come more often (measured: the planted job's full-collection share rose from 55% to 74% with
``gc.freeze()`` alone: ``pitstop doctor -- python tests/scripts/gc_heavy.py [--freeze]`` on the shared
2-core machine, 2026-12-04).
Explicit ``gc.collect()`` calls run the same collections, but they are the job's calls, not the collector's
pauses: where the probe told them apart (``GcPauses.automatic``) the rule reads the automatic collections only,
and per_step_cleanup answers for the calls (advising "collect by hand" to a job that already does, every step,
would be wrong).
Traces and attach's stack samples do not see the collector: there the rule is silent."""

from __future__ import annotations

from pitstop.core.findings import Finding, use
from pitstop.core.profile import GcGeneration, GcPauses, RankProfile
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.remedies import advise

GC_MIN = 0.05  # share of the window's step time inside collections (every generation) for a finding
FULL_HIGH = 0.20  # share of the step time the fix would take out of full collections, rated high
FULL_MEDIUM = 0.05  # that share rated medium; below it low
CONFIDENCE = 0.9  # the collector times the collections themselves; it cannot tell what a fix adds back
FULL = 2  # the generation whose collections traverse every tracked object
FOUND_COST = 3.0
"""What a found (unreachable) object costs a full collection, in survivors: it is traversed like one, then
cleared and freed. Measured on CPython 3.11, a full collection with and without 500k self-referencing
objects beside 2M survivors: 3.2× for lists, 2.9× for class instances, 2.7× for dicts, 1.9× for
``__slots__`` instances. The largest keeps the estimate from promising more than the fix gives."""


def _automatic(gc: GcPauses) -> list[GcGeneration]:
    """The collections the interpreter started itself (all of them, where an older profile did not say)."""
    return gc.automatic if gc.automatic is not None else gc.generations


def _by_hand_s(gc: GcPauses) -> float:
    """Time in the collections explicit gc.collect() calls ran (per_step_cleanup's), where told apart."""
    return gc.pause_s - sum(g.pause_s for g in gc.automatic) if gc.automatic is not None else 0.0


def _share(rank: RankProfile) -> float:
    gc = rank.gc_pauses
    if gc is None:
        return 0.0
    return sum(g.pause_s for g in _automatic(gc)) / max(rank.wall_s, 1e-9)


def _removed(gc: GcPauses, full_s: float) -> tuple[float, str]:
    """The part of the full collections' time the fix removes, and how it was found: traversing the
    survivors. The objects they found are still found, cleared and freed by the manual collections: their
    share of a collection is ``FOUND_COST`` × found against 1 × tracked (a survivor traversed once)."""
    full = _automatic(gc)[FULL]
    if not gc.tracked or not full.collections:
        return full_s, (
            "the full collections' whole time, an upper bound: it includes finding and freeing the garbage they "
            "found, which the manual collections still pay (the tracked objects were not counted)"
        )
    found = full.collected / full.collections
    part = gc.tracked / (gc.tracked + FOUND_COST * found)
    return full_s * part, (
        f"the part of them spent traversing the {gc.tracked:,} tracked objects ({part:.0%}, with the "
        f"{found:,.0f} objects each full collection found costing {FOUND_COST:.0f}× a survivor: traversed, "
        "cleared, freed, as the manual collections still do)"
    )


def _per_generation(gc: GcPauses) -> dict[str, dict[str, float]]:
    """Collections, total and longest pause (ms), steps hit, objects found: one entry per generation."""
    return {
        str(i): {
            "collections": g.collections,
            "pause_ms": round(g.pause_s * 1000, 1),
            "longest_ms": round(g.longest_s * 1000, 1),
            "steps": g.steps,
            "collected": g.collected,
        }
        for i, g in enumerate(_automatic(gc))
    }


def _summary(gc: GcPauses, share: float, steps: int) -> str:
    """What the collector did in the window, in one sentence."""
    full = _automatic(gc)[FULL]
    by_hand = gc.enabled is False
    return (
        f"Python's garbage collector took {share:.0%} of the measured time: "
        + (
            f"{full.collections} full collection{'s' if full.collections != 1 else ''} in {full.steps} of "
            f"{steps} steps, up to {full.longest_s * 1000:.0f} ms each, each traversing every tracked object "
            + (
                "the job keeps alive"
                if not gc.frozen
                else f"the job keeps alive but the {gc.frozen:,} frozen"
            )
            + (
                f" and finding {full.collected / full.collections:,.0f} garbage objects"
                if full.collected
                else ""
            )
            if full.collections
            else "young-generation collections, none of them full"
        )
        + (
            " (the job disabled automatic collection; its own gc.collect calls take the time)"
            if by_hand
            else ""
        )
        + "."
    )


@cause(
    CauseId.GC_PAUSES,
    title="Garbage-collector pauses stall the loop",
    because=(
        "Python's cyclic garbage collector stops the training loop to traverse every tracked object the "
        "job keeps alive (datasets held as Python lists, big dicts), and its full collections land inside "
        "steps"
    ),
    needs_gpu=False,
    needs=(Evidence.PROCESS,),
    fires_when=(
        "Python's garbage collector, timed per generation by a `gc.callbacks` callback during the window, "
        "takes ≥ {GC_MIN:.0%} of the step time (of the rank that loses most) in the collections it started "
        "itself (the job's own `gc.collect()` calls are per_step_cleanup's); high from {FULL_HIGH:.0%} in "
        "full (generation-2) collections the fix would remove"
    ),
    estimate=(
        "1/(1 − what the fix removes): `gc.freeze()` after setup, `gc.disable()` and a full `gc.collect()` "
        "every N steps take the survivors' traversal out of the full collections; finding and freeing the "
        "garbage they found stays (each found object costing {FOUND_COST:.0f}× a survivor, the tracked "
        "objects counted after the window), and so does the young generations' time. Without the count, "
        "the full collections' whole time, an upper bound. `gc.freeze()` alone shortens each full "
        "collection, but CPython then runs them more often"
    ),
    remedies=(RemedyId.MANUAL_GC,),
)
def gc_pauses(ctx: RuleContext) -> Finding | None:
    watched = [r for r in ctx.profile.ranks if r.gc_pauses is not None and r.steps]
    if not watched:
        return None
    worst = max(watched, key=_share)
    gc = worst.gc_pauses
    assert gc is not None
    share = min(1.0, _share(worst))
    if share < GC_MIN:
        return None
    gens = _automatic(gc)
    full = gens[FULL]
    full_share = min(share, full.pause_s / max(worst.wall_s, 1e-9))
    longest = max(g.longest_s for g in gens)
    steps = len(worst.steps)
    removed, how = _removed(gc, full.pause_s)
    young = sum(g.pause_s for g in gens[:FULL])
    automatic = gc.enabled is not False and full.collections > 0  # gc.disable() stops the young ones too
    if automatic:
        removed += young
    removed_share = min(share, removed / max(worst.wall_s, 1e-9))
    return Finding(
        cause=CauseId.GC_PAUSES,
        severity=severity_for(removed_share, FULL_HIGH, FULL_MEDIUM),
        confidence=CONFIDENCE,
        summary=_summary(gc, share, steps),
        evidence={
            "gc_frac": round(share, 3),
            "gen2_frac": round(full_share, 3),
            "generations": _per_generation(gc),
            "longest_pause_ms": round(longest * 1000, 1),
            "steps_with_gen2": full.steps,
            "steps": steps,
            "gc_enabled": gc.enabled,
            "frozen": gc.frozen,
            "tracked": gc.tracked,
            "rank": worst.rank,
            "by_hand_ms": round(_by_hand_s(gc) * 1000, 1),  # explicit gc.collect(): per_step_cleanup's
        },
        est_speedup=amdahl(removed_share, float("inf")),
        speedup_basis=(
            f"full (generation 2) collections took {full_share:.0%} of the window's wall time; gc.freeze() after "
            f"setup, gc.disable() and a gc.collect() every N steps take out {how}"
            + (
                f", and the young generations' automatic collections ({young / max(worst.wall_s, 1e-9):.0%} of "
                "the window; the manual ones traverse the young objects once)"
                if automatic
                else "; the job's own young collections stay"
            )
        ),
        fix=advise(
            ctx.framework,
            use(
                RemedyId.MANUAL_GC,
                enabled=gc.enabled,
                young_only=not full.collections,
                frozen=bool(gc.frozen),
            ),
        ),
    )
