"""The msgspec fast path and the stdlib path give the same columns, to the last bit, on odd values too.

Every chunk the fast path declines goes to the stdlib decoder; these tests force that for a whole trace and
compare, on a trace whose events carry what real exporters vary (quoted numbers, booleans, nulls, missing
keys, the lower-case "external id", non-object items, huge and negative numbers)."""

from __future__ import annotations

import dataclasses
import json
import random
from array import array
from pathlib import Path
from typing import Any

import pytest
from tests import kineto_ranks as kr

from pitstop.ingest.trace import fastevents
from pitstop.ingest.trace.events import read_columns

ODD = [None, True, False, "12.5", "abc", 7, -3, 2.5, [], {}, [1], {"a": 1}, -0.0, "1e300", "", "X", 1e300]
ARG_KEYS = ["stream", "device", "correlation", "External id", "bytes", "Input type", "dtype", "Group size"]


def _facts(cols: Any) -> Any:
    """The columns as plain comparable values (arrays by their bytes: -0.0 and NaN compare exactly)."""
    if dataclasses.is_dataclass(cols):
        return {f.name: _facts(getattr(cols, f.name)) for f in dataclasses.fields(cols) if f.name != "path"}
    if isinstance(cols, array):
        return (cols.typecode, cols.tobytes())
    if isinstance(cols, dict):
        return sorted((str(k), _facts(v)) for k, v in cols.items())
    if isinstance(cols, list | tuple):
        return [_facts(v) for v in cols]
    if isinstance(cols, set):
        return sorted(cols)
    return cols


def _odd_trace(path: Path, seed: int) -> Path:
    rng = random.Random(seed)
    doc = kr.job(2, steps=60, kernels=12, padding_ops=400)[0]  # ~3.5 MiB: several 1 MiB chunks
    events: list[Any] = doc["traceEvents"]
    for ev in events:
        if rng.random() < 0.08:
            key = rng.choice(["ph", "cat", "name", "ts", "dur", "args"])
            if rng.random() < 0.3:
                ev.pop(key, None)
            else:  # args that is not an object sends its chunk to the stdlib path: only in the first
                ev[key] = rng.choice([None, {}, {"stream": 7}] if key == "args" else ODD)
        args = ev.get("args")
        if isinstance(args, dict) and rng.random() < 0.1:
            args[rng.choice(ARG_KEYS)] = rng.choice([*ODD[:-1], 10**30 if seed == 0 else "nccl"])
        if isinstance(args, dict) and "External id" in args and rng.random() < 0.1:
            args["external id"] = args.pop("External id")
    kernel = next(ev for ev in events if ev.get("cat") == "kernel")
    odd_args = [{**kernel, "args": value} for value in ([1], "x", 5)]
    events[3:3] = [42, "text", None, [1, 2], *odd_args]  # the first chunk goes to the stdlib path
    body = ",\n".join(json.dumps(ev) for ev in events)
    path.write_text('{"schemaVersion": 1, "traceEvents": [\n' + body + "\n]}")
    return path


def _read(path: Path) -> Any:
    try:
        return _facts(read_columns(path))
    except Exception as exc:  # an odd value may end the read: both paths must end it the same way
        return (type(exc).__name__, str(exc))


@pytest.mark.parametrize("seed", range(6))
def test_fast_and_stdlib_paths_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    path = _odd_trace(tmp_path / "odd.json", seed)
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
    assert _facts(fast) == _facts(exact)
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
    assert _facts(read) == _facts(read_columns(per_line))
    assert read.events == len(events) and len(read.kernels) > 1
