"""The msgspec fast path and the stdlib path give the same columns, to the last bit, on odd values too.

Every chunk the fast path declines goes to the stdlib decoder; these tests force that for a whole trace and
compare, on a trace whose events carry what real exporters vary (quoted numbers, booleans, nulls, missing
keys, the lower-case "external id", non-object items, huge and negative numbers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests import kineto_ranks as kr
from tests.trace_facts import facts, odd_trace

from pitstop.trace import fastevents
from pitstop.trace.events import read_columns


def _read(path: Path) -> Any:
    try:
        return facts(read_columns(path))
    except Exception as exc:  # an odd value may end the read: both paths must end it the same way
        return (type(exc).__name__, str(exc))


@pytest.mark.parametrize("seed", range(6))
def test_fast_and_stdlib_paths_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    path = odd_trace(tmp_path / "odd.json", seed)
    taken = []
    decode = fastevents.decode

    def counted(text: str) -> list[Any] | None:
        batch = decode(text)
        taken.append(batch is not None)
        return batch

    monkeypatch.setattr(fastevents, "decode", counted)
    fast = _read(path)
    monkeypatch.setattr(fastevents, "decode", lambda text: None)
    exact = _read(path)
    assert fast == exact
    if not isinstance(fast, tuple):  # (10**30 ends both reads early: it does not fit the int64 columns)
        assert not taken[0] and any(taken)  # both paths were taken


def test_fast_path_declines_what_the_stdlib_rejects() -> None:
    good = '[{"ph": "X", "ts": 1, "dur": 2}]'
    assert fastevents.decode(good) is not None
    for bad in (
        '[{"ph": "X", "ts": NaN}]',
        '[{"ph": "X", "name": "a\tb"}]',  # a raw control character
        '[{"ph": "X"} {"ph": "X"}]',
        '[{"ph": "X", "args": [1]}]',  # args not an object: the stdlib path decides
        '[{"ph": "X", "x": ' + "[" * 5000 + "]" * 5000 + "}]",
    ):
        assert fastevents.decode(bad) is None, bad


def test_a_chunk_that_starts_with_another_phase_keeps_its_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flow events ("s" / "f") decode to empty tagged structs; a chunk opening with one is still the fast
    path's (once taken for the stdlib's plain values, and every complete event in it was dropped)."""
    doc = kr.job(2, steps=60, kernels=12, padding_ops=400)[0]
    events: list[Any] = []
    for i, ev in enumerate(doc["traceEvents"]):
        events.append({"ph": "f" if i % 2 else "s", "id": i, "pid": 0, "tid": 0, "ts": i, "cat": "ac2g"})
        events.append(ev)
    path = tmp_path / "flows.json"
    path.write_text('{"traceEvents": [\n' + ",\n".join(json.dumps(ev) for ev in events) + "\n]}")
    fast = read_columns(path)
    monkeypatch.setattr(fastevents, "decode", lambda text: None)
    exact = read_columns(path)
    assert facts(fast) == facts(exact)
    assert len(fast.kernels) == sum(1 for ev in doc["traceEvents"] if ev.get("cat") == "kernel") > 0


def test_a_trace_on_one_line_is_read_value_by_value_to_the_same_columns(tmp_path: Path) -> None:
    """No ``},`` + newline marks: every event goes through the windowed stdlib path. Non-ASCII names
    (window ends inside a multi-byte character), a 300 KB event (windows widen) and bare numbers (a number
    cut at a window's end must not be read short) give the columns of the same events one per line."""
    doc = kr.job(2, steps=30, kernels=8, padding_ops=100)[0]
    events: list[Any] = doc["traceEvents"]
    for i, ev in enumerate(events):
        if ev.get("cat") == "cpu_op" and i % 3 == 0:
            ev["name"] = f"aten::é日本🙂_{i}"  # 2-, 3- and 4-byte characters
    events[5:5] = [
        123456789012345678,
        3.25,
        {"ph": "X", "cat": "kernel", "name": "k" * 300_000, "ts": 1, "dur": 2},
    ]
    one_line, per_line = tmp_path / "one.json", tmp_path / "lines.json"
    one_line.write_text(json.dumps({"traceEvents": events}, ensure_ascii=False), encoding="utf-8")
    body = ",\n".join(json.dumps(ev, ensure_ascii=False) for ev in events)
    per_line.write_text('{"traceEvents": [\n' + body + "\n]}", encoding="utf-8")
    read = read_columns(one_line)
    assert facts(read) == facts(read_columns(per_line))
    assert read.events == len(events) and len(read.kernels) > 1


def test_batches_kept_past_the_next_read_keep_their_values(tmp_path: Path) -> None:
    """msgspec's Raw values are views into the buffer their chunk was decoded from, and the reader reuses a
    buffer only when nothing views it: a consumer that keeps every batch still reads each event's values."""
    from pitstop.trace.jsonstream import event_batches

    doc = kr.job(2, steps=60, kernels=12, padding_ops=400)[0]  # ~3.5 MiB: several 1 MiB reads
    for i, ev in enumerate(doc["traceEvents"]):
        if isinstance(ev.get("args"), dict):
            ev["args"]["Input type"] = ["float", f"c10::BFloat16 {i}"]
    path = tmp_path / "kept.json"
    path.write_text('{"traceEvents": [\n' + ",\n".join(json.dumps(ev) for ev in doc["traceEvents"]) + "\n]}")
    kept = list(event_batches(path, fastevents.decode))
    events = [
        ev if type(ev) is fastevents.Event else fastevents.as_event(ev) for batch in kept for ev in batch
    ]
    read = [ev.args.input_types() for ev in events if type(ev) is fastevents.Event and ev.args]
    planted = [ev["args"]["Input type"] for ev in doc["traceEvents"] if ev.get("ph") == "X" and "args" in ev]
    assert len(kept) > 2 and read == planted


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_a_view_kept_past_its_read_does_not_stop_the_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    """The buffer a read fills is cut to what was read, which fails while a view of it lives. A Dask worker's
    sampling profiler holds frames that outlive their call, with the call's arguments: a busy run failed
    "BufferError: Existing exports of data". Here every view lent to a read is kept, as such a frame keeps it."""
    from pitstop.trace import jsonstream

    path = tmp_path / f"held{suffix}"
    kr.write(kr.job(2, steps=60, kernels=12, padding_ops=400)[0], path)  # several 1 MiB reads
    plain = facts(read_columns(path))
    held: list[memoryview] = []
    readinto = jsonstream._Text.readinto

    def keeping(self: Any, view: memoryview) -> int:
        held.append(view)
        return readinto(self, view)

    monkeypatch.setattr(jsonstream._Text, "readinto", keeping)
    assert facts(read_columns(path)) == plain
    assert len(held) > 3
