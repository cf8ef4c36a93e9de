"""A trace fills the same profile a live run does: what only a trace knows is typed records in TraceStats, and
a profile saved before (string-keyed dicts, per-step means under ``trace``) reads back with the same facts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests import kineto_ranks as kr

from pitstop.core.profile import (
    GpuTime,
    IdleSplit,
    RankProfile,
    RunProfile,
    StepCategories,
    StepRecord,
    TraceStats,
    to_jsonable,
)
from pitstop.core.vocabulary import Source
from pitstop.diagnose.metrics import compute_metrics
from pitstop.trace import profile_of
from pitstop.trace.events import read_columns
from pitstop.trace.overview import overview

# a rank as pitstop analyze saved it before the trace's facts were typed records
OLD_RANK: dict[str, Any] = {
    "rank": 0,
    "steps": [{"index": i, "wall_s": 0.1, "data_wait_s": 0.01} for i in (1, 2, 3, 4)],
    "trace": {
        "steps": 4,
        "step_ms": 100.0,
        "breakdown_ms": {"Kernel": 60.0, "Memcpy": 1.0, "Memset": 0.0, "Communication": 9.0,
                         "Runtime": 5.0, "DataLoader": 10.0, "CPU Exec": 14.0, "Other": 1.0},
        "gpu_util": 0.7,
        "temporal": {"idle": 0.3, "compute": 0.6, "non_compute": 0.1},
        "idle_split": {"host_wait": 0.5, "kernel_wait": 0.25, "other": 0.25},
        "dataloader_ms": 10.0,
    },
}  # fmt: skip


def _read(rank: dict[str, Any]) -> TraceStats:
    trace = (
        RunProfile.from_dict({"schema": "pitstop.profile/1", "source": "analyze", "ranks": [rank]})
        .ranks[0]
        .trace
    )
    assert trace is not None
    return trace


def test_an_old_trace_reads_back_as_typed_records() -> None:
    t = _read(OLD_RANK)
    assert t.breakdown_ms == StepCategories(
        kernel=60.0, memcpy=1.0, communication=9.0, runtime=5.0, dataloader=10.0, cpu_exec=14.0, other=1.0
    )
    assert t.temporal == GpuTime(idle=0.3, compute=0.6, non_compute=0.1)
    assert t.idle_split == IdleSplit(host_wait=0.5, kernel_wait=0.25, other=0.25)
    # written back under the same keys it was read from
    assert to_jsonable(t)["breakdown_ms"] == OLD_RANK["trace"]["breakdown_ms"]
    assert to_jsonable(t)["temporal"] == OLD_RANK["trace"]["temporal"]


def test_an_old_trace_without_gpu_events_reads_back_as_none() -> None:
    """Before, a trace without GPU events (or steps) wrote its breakdowns as empty objects."""
    old = json.loads(json.dumps(OLD_RANK))
    old["trace"].update(breakdown_ms={}, temporal={}, idle_split={})
    t = _read(old)
    assert (t.breakdown_ms, t.temporal, t.idle_split) == (None, None, None)


def test_a_trace_s_step_time_and_data_wait_are_its_steps(tmp_path: Path) -> None:
    """The per-step facts a live run measures too are the rank's steps, not the trace's statistics."""
    path = kr.write(kr.job(1, steps=6, loader_us=1500.0)[0], tmp_path / "rank-0.json")
    cols = read_columns(path)
    view = overview(cols)
    rank = profile_of(cols)[0]
    assert len(rank.steps) == len(view.steps) == 6
    assert rank.mean_step_s == pytest.approx(view.mean_step_us / 1e6)
    assert rank.trace is not None and rank.trace.breakdown_ms is not None
    wait_ms = 1000 * sum(s.data_wait_s for s in rank.steps) / len(rank.steps)
    assert wait_ms == pytest.approx(rank.trace.breakdown_ms.dataloader) and wait_ms > 1.0
    assert not {"steps", "step_ms", "dataloader_ms", "device_name"} & set(to_jsonable(rank.trace))


def test_a_trace_s_host_syncs_are_its_steps(tmp_path: Path) -> None:
    """Each step's blocking synchronizations and the time blocked in them, as the live probe counts them;
    the metrics and host_sync read them one way for both."""
    path = kr.write(kr.job(1, steps=6)[0], tmp_path / "rank-0.json")
    rank = profile_of(read_columns(path))[0]
    assert all(s.syncs == 1 for s in rank.steps)  # the simulated job synchronizes once a step
    assert all(s.sync_s is not None and s.sync_s > 0 for s in rank.steps)
    assert not {"syncs_per_step", "sync_ms"} & set(to_jsonable(rank.trace))
    m = compute_metrics(RunProfile(source=Source.ANALYZE, ranks=[rank]))
    assert m.syncs_per_step == 1.0
    assert m.sync_frac == pytest.approx(sum(s.sync_s or 0.0 for s in rank.steps) / rank.wall_s)


def test_an_old_trace_s_syncs_read_back_into_its_steps() -> None:
    """A profile saved with the trace's per-step means (``syncs_per_step``, ``sync_ms``) diagnoses the same:
    the means are spread over its steps."""
    old = json.loads(json.dumps(OLD_RANK))
    old["trace"].update(syncs_per_step=2.5, sync_ms=20.0)
    profile = RunProfile.from_dict({"schema": "pitstop.profile/1", "source": "analyze", "ranks": [old]})
    steps = profile.ranks[0].steps
    assert [s.syncs for s in steps] == [2, 3, 2, 3] and all(s.sync_s == 0.02 for s in steps)
    m = compute_metrics(profile)
    assert m.syncs_per_step == 2.5 and m.sync_frac == pytest.approx(0.2)
    # a profile whose steps carry their syncs is read as it is
    saved = json.loads(json.dumps(OLD_RANK))
    saved["steps"][0]["syncs"] = 7
    saved["trace"]["syncs_per_step"] = 1.0
    read = RunProfile.from_dict({"schema": "pitstop.profile/1", "source": "analyze", "ranks": [saved]})
    assert [s.syncs for s in read.ranks[0].steps] == [7, None, None, None]


def test_syncs_per_step_weigh_each_rank_alike() -> None:
    """Ranks that measured different numbers of steps (traces of different lengths): the job's syncs per
    step and blocked share are the mean over ranks of each rank's own, as a trace's were before."""
    short = RankProfile(rank=0, steps=[StepRecord(index=1, wall_s=0.1, syncs=10, sync_s=0.01)])
    long = RankProfile(
        rank=1, steps=[StepRecord(index=i, wall_s=0.1, syncs=2, sync_s=0.03) for i in range(3)]
    )
    m = compute_metrics(RunProfile(source=Source.ANALYZE, ranks=[short, long]))
    assert m.syncs_per_step == pytest.approx(6.0)  # (10 + 2) / 2, not 16 / 4
    assert m.sync_frac == pytest.approx(0.2)  # (0.01 + 0.03) / 2 over 0.1


def test_the_document_keeps_the_trace_keys_it_had_written_from_the_steps(tmp_path: Path) -> None:
    """A document only ever gains keys: a rank's ``trace`` still carries its step count, mean step time, data
    wait and syncs, now written from its steps, and reading the document back takes the steps as they are."""
    path = kr.write(kr.job(1, steps=6, loader_us=1500.0)[0], tmp_path / "rank-0.json")
    rank = profile_of(read_columns(path))[0]
    doc = json.loads(json.dumps(RunProfile(source=Source.ANALYZE, ranks=[rank]).to_dict()))
    assert doc["schema"] == "pitstop.profile/1"
    trace = doc["ranks"][0]["trace"]
    assert trace["steps"] == 6 and trace["step_ms"] == pytest.approx(rank.mean_step_s * 1000)
    assert trace["syncs_per_step"] == 1.0 and trace["sync_ms"] > 0 and trace["dataloader_ms"] > 1.0
    assert {"device_name", "attention_ms"} <= set(trace)
    back = RunProfile.from_dict(doc).ranks[0]
    assert back.steps == rank.steps and back.trace == rank.trace
