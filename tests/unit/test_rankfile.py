"""The rank file's one codec: the end-of-job reader and the live follower read the same lines the same way, and
every source assembles a RankProfile's common fields one way."""

from __future__ import annotations

import json
from pathlib import Path

from pitstop.core.profile import Environment, GpuSample, RankProfile, StepRecord, assemble_rank, to_jsonable
from pitstop.probe.rankfile import Kind, RankDraft, Step, decode, line, on_host, plain_step, read_text
from pitstop.probe.stream import read_stream
from pitstop.runner.follow import RankFollower


def _lines() -> list[str]:
    return [
        line(Kind.START, rank=1, local_rank=1, pid=42, warmup=2),
        line(Kind.ENVIRONMENT, environment=to_jsonable(Environment(hostname="h", device="cpu")), rank=3),
        line(Kind.WINDOW, t=0.25),
        *(line(Kind.STEP, step=plain_step(StepRecord(index=i, wall_s=0.1)), t=i / 10) for i in range(1, 6)),
        line(Kind.GPU, samples=to_jsonable([GpuSample(t=0.3, util=50.0)])),
        line(Kind.ERROR, text="probe stopped"),
    ]


def test_the_follower_and_the_end_reader_read_the_same_steps(tmp_path: Path) -> None:
    path = tmp_path / "rank-42.jsonl"
    path.write_text("".join(_lines()))
    read = read_stream(path)
    assert read is not None
    rank, finished = read
    assert not finished and rank.rank == 3 and rank.local_rank == 1 and rank.pid == 42
    assert rank.hostname == "h" and rank.probe_errors == ["probe stopped"]
    assert (rank.window_start_t, rank.window_end_t) == (0.25, 0.5)
    (news,) = RankFollower(tmp_path).poll()
    assert news.rank == rank.rank and news.steps == rank.steps and news.gpu == rank.gpu_samples
    assert news.environment == rank.environment


def test_the_follower_keeps_who_the_rank_is_not_its_steps(tmp_path: Path) -> None:
    (tmp_path / "rank-42.jsonl").write_text("".join(_lines()))
    follower = RankFollower(tmp_path)
    follower.poll()
    (tail,) = follower._tails.values()
    assert tail.draft.rank == 3 and tail.draft.warmup == 2 and tail.draft.steps == [] and tail.draft.gpu == []


def test_damaged_lines_and_unknown_kinds_are_skipped() -> None:
    good = line(Kind.STEP, step=plain_step(StepRecord(index=3, wall_s=0.1)), t=0.3)
    for raw in [
        '{"kind":"step","step":{"index":6,"wall',  # cut short by a death
        '{"kind":"step","step":5,"t":1}',  # not a record
        '{"kind":"start","rank":null}',
        '{"kind":"a newer kind","x":1}',
        '["kind","step"]',
        '{"kind":["step"]}',
    ]:
        assert decode(raw) is None, raw
    assert isinstance(decode(good), Step)
    text = line(Kind.START, rank=0, pid=1, warmup=2) + "garbage\n" + good + '{"kind":"later","y":2}\n'
    read = read_text(text)
    assert read is not None and [s.index for s in read[0].steps] == [3]


def test_a_finished_profile_wins_and_nothing_is_not_a_rank() -> None:
    whole = RankProfile(rank=2, steps=[StepRecord(index=9, wall_s=0.2)])
    assert read_text("".join(_lines()) + line(Kind.PROFILE, profile=to_jsonable(whole))) == (whole, True)
    assert read_text(line(Kind.WINDOW, t=1.0)) is None  # neither a start nor an error
    draft = RankDraft()
    assert draft.profile() == RankProfile()


def test_lines_are_one_compact_json_object_each() -> None:
    text = line(Kind.WINDOW, t=0.5)
    assert text == '{"kind":"window","t":0.5}\n' and json.loads(text) == {"kind": "window", "t": 0.5}


def test_counts_not_yet_on_the_host_go_as_unknown() -> None:
    device_count = object()  # stands for a count still on the GPU (a tensor)
    record = StepRecord(index=1, wall_s=0.1, tokens=device_count, real_tokens=7)  # type: ignore[arg-type]
    assert on_host(record).tokens is None and on_host(record).real_tokens == 7
    assert plain_step(record)["tokens"] is None
    plain = StepRecord(index=1, wall_s=0.1, tokens=5)
    assert on_host(plain) is plain


def test_a_rank_is_assembled_one_way() -> None:
    records = [StepRecord(index=i, wall_s=0.1) for i in range(1, 6)]
    env = Environment(hostname="node-1")
    cut = assemble_rank(0, env, steps=records, warmup=2, window=(1.0, 2.0), errors=["e"])
    assert [s.index for s in cut.steps] == [3, 4, 5] and cut.warmup_steps == 2
    assert cut.hostname == "node-1" and (cut.window_start_t, cut.window_end_t) == (1.0, 2.0)
    inside = assemble_rank(0, env, steps=records, warmup=10)  # ended inside the warm-up: after the first
    assert [s.index for s in inside.steps] == [2, 3, 4, 5] and inside.warmup_steps == 1
    measured = assemble_rank(4, steps=[StepRecord(index=0, wall_s=0.1)])  # a trace's: none of it warm-up
    assert [s.index for s in measured.steps] == [0] and measured.warmup_steps == 0
    assert measured.environment == Environment() and measured.hostname is None
