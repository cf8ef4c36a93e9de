"""Issue 43 item 4: one rank's trace of a multi-rank job is not the job. Alone, a rank's collective time
cannot tell waiting for a late rank from transfer: communication_bound says so, with lower confidence, and
asks for the other ranks; the straggler check is listed as not checked ("1 of 8"). Given every rank, the
same time is one rank being late.

tests/fixtures/traces/ranks/: eight hand-made rank traces (tests/kineto_ranks.py's simulated data-parallel
job: 4 steps, clock offsets, rank 7's kernels 6 ms slower per step, a 0.3 ms all-reduce, no host syncs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.conftest import require_shared

from pitstop.core.vocabulary import CauseId, Evidence, Severity, Source
from pitstop.diagnose import diagnose
from pitstop.diagnose.causes.communication_bound import ONE_RANK_CONFIDENCE
from pitstop.ingest.load import Inputs, load_run

RANKS = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "ranks"


def _analyze(*paths: Path):
    return diagnose(load_run(Inputs(paths=list(paths), jobs=1)))


def test_all_eight_ranks_name_the_late_rank_and_no_communication() -> None:
    d = _analyze(RANKS)
    causes = {f.cause: f for f in d.findings}
    assert CauseId.STRAGGLER in causes and causes[CauseId.STRAGGLER].evidence["slow_rank"] == 7
    assert CauseId.COMMUNICATION_BOUND not in causes  # the waiting is rank 7's, not the link's
    ranks = d.coverage.state(Evidence.ALL_RANKS)
    assert ranks is not None and ranks.present and ranks.detail == "all 8: ranks 0-7"
    assert CauseId.STRAGGLER in d.coverage.checked


def test_one_rank_alone_is_hedged_and_asks_for_the_others() -> None:
    d = _analyze(RANKS / "rank-0.pt.trace.json.gz")
    assert d.profile.world_size == 8 and len(d.profile.ranks) == 1
    comm = next(f for f in d.findings if f.cause == CauseId.COMMUNICATION_BOUND)
    assert comm.confidence == pytest.approx(ONE_RANK_CONFIDENCE)
    assert comm.severity != Severity.HIGH
    assert "cannot tell waiting for a late rank from transfer" in comm.summary
    assert "other ranks' traces" in comm.summary
    assert comm.evidence["ranks_read"] == 1 and comm.evidence["world_size"] == 8
    assert "upper bound" in comm.speedup_basis
    ranks = d.coverage.state(Evidence.ALL_RANKS)
    assert ranks is not None and not ranks.present and ranks.detail.startswith("1 of 8 (rank 0)")
    straggler = next(c for c in d.coverage.not_checked if c.cause == CauseId.STRAGGLER)
    assert straggler.why is not None and "1 of 8" in straggler.why


def test_a_real_rank_of_eight_is_not_read_as_the_job() -> None:
    """HTA's control trace: an A100, rank 3 of an 8-rank job (distributedInfo), NCCL kernels."""
    path = require_shared("traces/hta__trace_diff__control__control.json.gz")
    d = _analyze(path)
    assert d.profile.source == Source.ANALYZE and d.profile.world_size == 8
    comm = next(f for f in d.findings if f.cause == CauseId.COMMUNICATION_BOUND)
    assert comm.confidence == pytest.approx(ONE_RANK_CONFIDENCE)
    assert "rank 3 of 8" in comm.summary
    assert CauseId.STRAGGLER not in d.coverage.checked


def test_a_real_one_process_trace_is_not_hedged() -> None:
    """A one-process job (world size 1 in distributedInfo) keeps the trace's full confidence."""
    path = require_shared("traces/hta__ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
    d = _analyze(path)
    assert d.profile.world_size == 1
    ranks = d.coverage.state(Evidence.ALL_RANKS)
    assert ranks is not None and ranks.present
    assert all(f.evidence.get("ranks_read") is None for f in d.findings)
