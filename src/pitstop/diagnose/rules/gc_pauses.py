"""gc_pauses: Python's cyclic garbage collector stalls the training loop.

Live, the probe times every collection in the measured window, per generation (``RankProfile.gc_pauses``),
so the share is measured. A full (generation-2) collection traverses every tracked object the job keeps
alive: millions of them (a tokenized dataset held as Python lists, big dicts of metadata) make each one a
long pause inside some step. ``gc.disable()`` with a ``gc.collect(1)`` every N steps takes the full
collections out of the loop; the young generations' work stays (a manual ``gc.collect(1)`` still traverses
the young objects), so the estimate counts the full collections only. ``gc.freeze()`` alone is not the fix
for the time: CPython (3.13 and before) starts a full collection once the objects promoted since the last one exceed a quarter
of those it kept, so with fewer objects to traverse the collections come more often (measured: the planted
job's full-collection share rose from 55% to 74% with ``gc.freeze()`` alone: ``pitstop doctor -- python
tests/scripts/gc_heavy.py [--freeze]`` on the shared 2-core machine, 2026-12-04).
Traces and attach's stack samples do not see the collector: there the rule is silent.
"""

from __future__ import annotations

from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.findings import Finding, use
from pitstop.profile import GcPauses, RankProfile
from pitstop.remedies import advise
from pitstop.vocabulary import CauseId, RemedyId

GC_MIN = 0.05  # share of the window's step time inside collections (every generation) for a finding
FULL_HIGH = 0.20  # share of the step time inside full (generation-2) collections rated high
FULL_MEDIUM = 0.05  # share of the step time inside full collections rated medium; below it low
CONFIDENCE = 0.9  # the collector times the collections themselves; it cannot tell what a fix adds back
FULL = 2  # the generation whose collections traverse every tracked object


def _share(rank: RankProfile) -> float:
    gc = rank.gc_pauses
    return gc.pause_s / max(rank.wall_s, 1e-9) if gc is not None else 0.0


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
        for i, g in enumerate(gc.generations)
    }


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
    full = gc.generations[FULL]
    full_share = min(share, full.pause_s / max(worst.wall_s, 1e-9))
    longest = max(g.longest_s for g in gc.generations)
    steps = len(worst.steps)
    by_hand = gc.enabled is False
    return Finding(
        cause=CauseId.GC_PAUSES,
        severity=severity_for(full_share, FULL_HIGH, FULL_MEDIUM),
        confidence=CONFIDENCE,
        summary=(
            f"Python's garbage collector took {share:.0%} of the measured time: "
            + (
                f"{full.collections} full collection{'s' if full.collections != 1 else ''} in {full.steps} of "
                f"{steps} steps, up to {full.longest_s * 1000:.0f} ms each, each traversing every tracked object "
                + (
                    "the job keeps alive"
                    if not gc.frozen
                    else f"the job keeps alive but the {gc.frozen:,} frozen"
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
        ),
        evidence={
            "gc_frac": round(share, 3),
            "gen2_frac": round(full_share, 3),
            "generations": _per_generation(gc),
            "longest_pause_ms": round(longest * 1000, 1),
            "steps_with_gen2": full.steps,
            "steps": steps,
            "gc_enabled": gc.enabled,
            "frozen": gc.frozen,
            "rank": worst.rank,
        },
        est_speedup=amdahl(full_share, float("inf")),
        speedup_basis=(
            "measured full-collection (generation 2) time over the window's wall time, which gc.disable() with "
            "gc.collect(1) every N steps takes out of the loop; the young generations' time is kept: a manual "
            "gc.collect(1) still traverses the young objects. An upper bound: the full collections' time includes "
            "freeing the garbage they find, which the manual collections still pay (calibration: ×2.86 estimated, "
            "×1.40 measured on a planted job)"
        ),
        fix=advise(
            ctx.framework, use(RemedyId.MANUAL_GC, enabled=gc.enabled, young_only=not full.collections)
        ),
    )
