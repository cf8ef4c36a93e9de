"""gc_pauses: the rule on hand-made profiles (measured collector times, per generation), its remedy's advice,
and the profile field in a saved profile."""

from __future__ import annotations

import pytest
from tests.factories import profile, steps

from pitstop.core.findings import Finding
from pitstop.core.profile import GcGeneration, GcPauses, RunProfile
from pitstop.core.vocabulary import Framework, Severity
from pitstop.diagnose import diagnose
from pitstop.remedies import RemedyId, advise, remedy, use


def finding(p: RunProfile) -> Finding | None:
    return next((f for f in diagnose(p).findings if f.cause == "gc_pauses"), None)


def pauses(young_s: float = 0.01, full: int = 0, full_s: float = 0.0, steps_hit: int = 0) -> GcPauses:
    return GcPauses(
        generations=[
            GcGeneration(collections=400, pause_s=young_s, longest_s=0.001, collected=50, steps=20),
            GcGeneration(collections=40, pause_s=young_s / 2, longest_s=0.002, collected=10, steps=20),
            GcGeneration(
                collections=full,
                pause_s=full_s,
                longest_s=full_s / max(full, 1),
                collected=9,
                steps=steps_hit,
            ),
        ],
        enabled=True,
        thresholds=[700, 10, 10],
        frozen=0,
    )


def test_full_collections_that_take_a_third_of_the_window_are_a_high_finding() -> None:
    p = profile("cpu", steps(n=20, wall=0.1))  # 2 s measured
    p.ranks[0].gc_pauses = pauses(young_s=0.04, full=3, full_s=0.6, steps_hit=3)
    f = finding(p)
    assert f is not None and f.severity is Severity.HIGH
    ev = f.evidence
    assert ev["gc_frac"] == pytest.approx((0.04 + 0.02 + 0.6) / 2.0, abs=1e-3)
    assert ev["gen2_frac"] == pytest.approx(0.3)
    assert ev["steps_with_gen2"] == 3 and ev["steps"] == 20
    assert ev["generations"]["2"] == {
        "collections": 3,
        "pause_ms": 600.0,
        "longest_ms": 200.0,
        "steps": 3,
        "collected": 9,
    }
    assert ev["generations"]["0"]["collections"] == 400 and ev["longest_pause_ms"] == 200.0
    assert ev["gc_enabled"] is True and ev["frozen"] == 0 and ev["rank"] == 0
    assert f.est_speedup == pytest.approx(1 / (1 - 0.33))  # full and young: gc.disable() stops both
    assert "young" in f.speedup_basis and "3 full collections in 3 of 20 steps" in f.summary
    assert f.fix.uses[0].remedy is RemedyId.MANUAL_GC
    assert "gc.collect()" in (f.fix.snippet or "") and "TrainerCallback" in f.fix.snippets["hf_trainer"]


def test_with_the_tracked_objects_counted_the_estimate_leaves_the_found_garbage_to_the_fix() -> None:
    """The planted job's own figures (3.4 M tracked, ~943 k found per full collection): the fix removes the
    survivors' traversal, and the found objects, at 3× a survivor each, are still found by gc.collect(1)."""
    p = profile("cpu", steps(n=20, wall=0.1))  # 2 s measured
    gc = pauses(young_s=0.04, full=3, full_s=0.6, steps_hit=3)
    gc.generations[2].collected = 3 * 943_000
    gc.tracked = 3_400_000
    p.ranks[0].gc_pauses = gc
    f = finding(p)
    assert f is not None and f.evidence["tracked"] == 3_400_000
    part = 3_400_000 / (3_400_000 + 3 * 943_000)  # 55% of the full collections' time is the survivors'
    assert f.est_speedup == pytest.approx(1 / (1 - 0.3 * part - 0.03), rel=1e-3)
    assert f.est_speedup < 1 / (1 - 0.33)  # below the upper bound the uncounted case gives
    assert "3,400,000 tracked objects (55%" in f.speedup_basis and "943,000" in f.speedup_basis
    gc.tracked = None
    f = finding(p)
    assert (
        f is not None and f.est_speedup == pytest.approx(1 / (1 - 0.33)) and "upper bound" in f.speedup_basis
    )
    gc.enabled, gc.tracked = False, 3_400_000  # the job collects by hand: its own young collections stay
    f = finding(p)
    assert f is not None and f.est_speedup == pytest.approx(1 / (1 - 0.3 * part), rel=1e-3)
    assert "own young collections stay" in f.speedup_basis


def test_the_summary_says_what_a_full_collection_traverses() -> None:
    p = profile("cpu", steps(n=20, wall=0.1))
    p.ranks[0].gc_pauses = pauses(young_s=0.04, full=3, full_s=0.6, steps_hit=3)
    f = finding(p)
    assert (
        f is not None
        and "every tracked object the job keeps alive and finding 3 garbage objects." in f.summary
    )
    p.ranks[0].gc_pauses.frozen = 1_000_000
    f = finding(p)
    assert f is not None and "keeps alive but the 1,000,000 frozen and finding 3" in f.summary


def test_a_collector_below_the_threshold_or_not_watched_is_no_finding() -> None:
    quiet = profile("cpu", steps(n=20, wall=0.1))
    quiet.ranks[0].gc_pauses = pauses(young_s=0.02, full=1, full_s=0.05, steps_hit=1)  # 4% of 2 s
    assert finding(quiet) is None
    unwatched = profile("cpu", steps(n=20, wall=0.1))  # a trace or attach: gc_pauses stays None
    assert unwatched.ranks[0].gc_pauses is None and finding(unwatched) is None


def test_young_generation_time_alone_is_low_with_no_gain_claimed() -> None:
    p = profile("cpu", steps(n=20, wall=0.1))
    p.ranks[0].gc_pauses = pauses(young_s=0.2)  # 15% in young collections, no full one
    f = finding(p)
    assert f is not None and f.severity is Severity.LOW and f.est_speedup == pytest.approx(1.0)
    assert f.evidence["steps_with_gen2"] == 0 and "none of them full" in f.summary
    assert "reference cycles" in f.fix.text  # no schedule removes it: the advice says what does


def test_the_rank_that_loses_most_is_the_one_reported() -> None:
    p = profile("cpu", steps(n=20, wall=0.1), ranks=2)
    p.ranks[0].gc_pauses = pauses(young_s=0.01)
    p.ranks[1].gc_pauses = pauses(full=2, full_s=0.4, steps_hit=2)
    f = finding(p)
    assert f is not None and f.evidence["rank"] == 1 and f.evidence["gen2_frac"] == pytest.approx(0.2)


@pytest.mark.parametrize("fw", list(Framework))
def test_the_advice_names_the_manual_schedule_in_every_framework(fw: Framework) -> None:
    advice = remedy(RemedyId.MANUAL_GC).advice(fw, {"enabled": True, "young_only": False})
    assert "gc.disable()" in advice.text and "gc.collect()" in advice.snippet
    assert (
        "gc.collect(1)" not in advice.snippet
    )  # it would leave garbage that outlived it in the oldest generation
    assert "gc.freeze()" in advice.snippet and "None" not in advice.text
    by_hand = advise(fw, use(RemedyId.MANUAL_GC, enabled=False)).text
    assert "already collects by hand" in by_hand and "gc.freeze() after setup" in by_hand
    frozen = advise(fw, use(RemedyId.MANUAL_GC, enabled=False, frozen=True)).text
    assert "already freezes" in frozen and "break the cycles" in frozen
    assert not remedy(RemedyId.MANUAL_GC).tunable


def test_gc_pauses_survive_a_saved_profile_and_older_files_still_load() -> None:
    p = profile("cpu", steps(n=4))
    p.ranks[0].gc_pauses = pauses(full=1, full_s=0.2, steps_hit=1)
    back = RunProfile.from_dict(p.to_dict())
    assert back == p and isinstance(back.ranks[0].gc_pauses, GcPauses)
    old = p.to_dict()
    del old["ranks"][0]["gc_pauses"]
    assert RunProfile.from_dict(old).ranks[0].gc_pauses is None
