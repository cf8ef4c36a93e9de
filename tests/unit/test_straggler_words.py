"""The straggler finding compares the slow rank with ranks that exist: the other one of two, the median and
the fastest of more (a "median rank" of two ranks would be their mean, a rank nobody has)."""

from __future__ import annotations

from tests.factories import profile, steps

from pitstop.diagnose import diagnose
from pitstop.diagnose.causes.straggler import _slowest_part
from pitstop.diagnose.ranks import RankComm


def _straggler(ranks: int, slow: int, data: float):  # type: ignore[no-untyped-def]
    p = profile("cuda", util=90.0, ranks=ranks)
    p.ranks[slow].steps = steps(wall=0.1, data=data)
    return next(f for f in diagnose(p).findings if f.cause == "straggler")


def test_two_ranks_compare_with_the_other_rank() -> None:
    f = _straggler(2, 1, 0.031)
    assert f.evidence["slow_rank"] == 1
    assert "31% of the step vs 0% on the other rank" in f.summary
    assert "median" not in f.summary


def test_more_ranks_name_the_median_and_the_fastest() -> None:
    p = profile("cuda", util=90.0, ranks=4)
    p.ranks[2].steps = steps(wall=0.1, data=0.03)
    p.ranks[0].steps = steps(wall=0.1, data=0.0)
    for r in (1, 3):
        p.ranks[r].steps = steps(wall=0.1, data=0.005)
    f = next(f for f in diagnose(p).findings if f.cause == "straggler")
    assert f.evidence["slow_rank"] == 2
    assert "30% of the step vs 5% on the median rank and 0% on the fastest (rank 0)" in f.summary


def _comm(rank: int, compute_s: float) -> RankComm:
    return RankComm(rank, None, 0.3, 0.001, compute_s, 0.01, 0.001, 0.0, 0.0, 2.0, 1e6, 0.0, 0.0, 0.0)


def test_arrival_reasons_name_the_other_rank_of_two_and_the_median_of_more() -> None:
    # by arrival at collectives (the live doctor's timed collectives): "ranks" was said of a single rank
    reason, detail = _slowest_part(_comm(0, 0.198), [_comm(1, 0.152)])
    assert reason == "compute"
    assert detail == "its forward/backward compute takes 198 ms per step vs 152 ms on the other rank"
    _, detail = _slowest_part(_comm(0, 0.198), [_comm(1, 0.152), _comm(2, 0.150), _comm(3, 0.170)])
    assert detail.endswith("vs 152 ms on the other ranks (median)")
