"""The rank file holds every finished step the moment it finishes, and reads back whatever a death left."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pitstop.core.profile import Environment, GpuSample, RankProfile, StepRecord, to_jsonable
from pitstop.probe.config import ProbeConfig
from pitstop.probe.rankfile import plain_step
from pitstop.probe.stream import RankStream, read_stream, stream_path

torch = pytest.importorskip("torch")

from tests.unit.test_probe_inprocess import train  # noqa: E402

from pitstop.probe.probe import Probe  # noqa: E402


def _lines_of_a_dead_process(out: Path) -> Path:
    stream = RankStream(out)
    stream.write("start", rank=1, local_rank=1, pid=42, warmup=2)
    stream.write("environment", environment=to_jsonable(Environment(hostname="h", device="cpu")), rank=3)
    for i in range(1, 6):
        if i == 3:
            stream.write("window", t=0.3)
        stream.write(
            "step", step=plain_step(StepRecord(index=i, wall_s=0.1, tokens=64, real_tokens=60)), t=i / 10
        )
    stream.write("gpu", samples=to_jsonable([GpuSample(t=0.35, util=50.0), GpuSample(t=0.45, util=70.0)]))
    stream.close()
    path = stream_path(out, os.getpid())
    with path.open("a") as f:
        f.write('{"kind":"step","step":{"index":6,"wall')  # the line the SIGKILL cut short
    return path


def test_a_dead_process_leaves_its_finished_steps(tmp_path: Path) -> None:
    read = read_stream(_lines_of_a_dead_process(tmp_path))
    assert read is not None
    rank, finished = read
    assert not finished
    assert rank.rank == 3  # the rank the environment line corrected
    assert [s.index for s in rank.steps] == [3, 4, 5] and rank.warmup_steps == 2
    assert rank.steps[0].real_tokens == 60
    assert (rank.window_start_t, rank.window_end_t) == (0.3, 0.5)
    assert [s.util for s in rank.gpu_samples] == [50.0, 70.0]
    assert rank.environment.hostname == "h"


def test_a_finished_profile_wins_over_the_lines_before_it(tmp_path: Path) -> None:
    path = _lines_of_a_dead_process(tmp_path)
    whole = RankProfile(
        rank=0, warmup_steps=2, steps=[StepRecord(index=3, wall_s=0.2)], stopped_by_probe=True
    )
    with path.open("a") as f:
        f.write("\n")
    RankStream(tmp_path).write("profile", profile=to_jsonable(whole))
    assert read_stream(path) == (whole, True)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_writes_its_own_file(tmp_path: Path) -> None:
    stream = RankStream(tmp_path)
    stream.write("start", rank=0, local_rank=0, pid=os.getpid(), warmup=0)
    child = os.fork()
    if child == 0:  # a trainer started by fork: its steps go to its own file, never into its parent's
        stream.write("start", rank=1, local_rank=1, pid=os.getpid(), warmup=0)
        os._exit(0)
    os.waitpid(child, 0)
    stream.write("window", t=1.0)
    parent = stream_path(tmp_path, os.getpid()).read_text().splitlines()
    assert [json.loads(line)["kind"] for line in parent] == ["start", "window"]
    forked = stream_path(tmp_path, child).read_text().splitlines()
    assert [json.loads(line)["rank"] for line in forked] == [1]


def test_device_counts_go_as_unknown_not_as_tensors() -> None:
    record = StepRecord(index=1, wall_s=0.1, tokens=torch.tensor(64), real_tokens=7)
    assert plain_step(record)["tokens"] is None and plain_step(record)["real_tokens"] == 7


def test_the_probe_appends_each_step_as_it_finishes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    original = Probe.measured_steps
    monkeypatch.setattr(Probe, "measured_steps", lambda self: calls.append(1) or original(self))
    probe = Probe(ProbeConfig(warmup=3, steps=None, out_dir=tmp_path, announce=False)).install()
    try:
        train(40)
        read = read_stream(stream_path(tmp_path, probe._pid))  # the process is alive and not finished
        assert read is not None
        rank, finished = read
        assert not finished and [s.index for s in rank.steps] == list(range(4, 41))
        assert all(s.real_tokens is not None and s.forward_s is not None for s in rank.steps)
        assert calls == []  # the measured steps are counted as they come, never rebuilt per step (quadratic)
        done = probe.finish(reason="end")
    finally:
        probe.hooks.remove()
    assert read_stream(stream_path(tmp_path, probe._pid)) == (done, True)
