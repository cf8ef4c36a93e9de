"""The C loop's reader of text (``take_text``: complete events straight from a chunk of trace text, without
msgspec's structs) gives the columns of the msgspec path and of the Python loop, to the last bit, and declines
every chunk it could not read exactly as msgspec does, before taking any event of it."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from tests import kineto_ranks as kr
from tests.trace_facts import facts, odd_trace

from pitstop.trace import events
from pitstop.trace.events import read_columns

pytest.importorskip("pitstop.trace._eventloop")


def _three(path: Path) -> list[Any]:
    """The facts by the text reader, by msgspec's structs into the C loop, and by the Python loop."""

    def read(**how: bool) -> Any:
        try:
            cols = read_columns(path, **how)
        except Exception as exc:  # an odd value may end the read: every path must end it the same way
            return (type(exc).__name__, str(exc))
        return facts(cols), list(cols.categories)

    return [read(), read(from_text=False), read(c_loop=False)]


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many chunks the text reader took whole, in part, or declined."""
    counts = {"taken": 0, "partial": 0, "declined": 0}
    from pitstop.trace._eventloop import Loop

    class Counted:
        def __init__(self, loop: Any) -> None:
            self.loop = loop

        def take_text(self, chunk: Any) -> Any:
            done = self.loop.take_text(chunk)
            key = "declined" if done is None else "taken" if done[0] == done[1] else "partial"
            counts[key] += 1
            return done

        def __getattr__(self, name: str) -> Any:
            return getattr(self.loop, name)

    real = events._c_loop
    monkeypatch.setattr(events, "_c_loop", lambda loop: Counted(real(loop)))
    assert isinstance(real(events._EventLoop(events.TraceColumns(path=Path("t")), fast=False)), Loop)
    return counts


def test_the_shared_traces_are_read_from_their_text(
    shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = _counting(monkeypatch)
    traces = sorted((shared_data / "traces").glob("*.json*"))
    assert traces
    for trace in traces:
        text, structs, python = _three(trace)
        assert text == structs == python, trace.name
    assert counts["taken"] > 20 and counts["declined"] == counts["partial"] == 0


@pytest.mark.parametrize("seed", range(4))
def test_odd_values_read_the_same(tmp_path: Path, seed: int) -> None:
    text, structs, python = _three(odd_trace(tmp_path / "odd.json", seed))
    assert text == structs == python


# what an event's text may hold that Kineto's does not: (what, the event's text from its json.dumps)
SPELLINGS = [
    ("escaped name", lambda t: t.replace('"name": "', '"name": "\\u0061\\"\\\\', 1)),
    ("escaped key", lambda t: t.replace('"ts":', '"\\u0074s":', 1)),
    ("duplicate time", lambda t: t.replace('"ts":', '"ts": 5, "ts":', 1)),
    ("duplicate arg", lambda t: t.replace('"args": {', '"args": {"correlation": 1, ', 1)),
    ("surrogate pair", lambda t: t.replace('"args": {', '"args": {"note": "\\ud83d\\ude00", ', 1)),
    ("escapes skipped", lambda t: t.replace('"args": {', '"args": {"note": "a\\"b\\\\c\\/\\n\\u00e9", ', 1)),
    ("non-ASCII name", lambda t: t.replace('"name": "', '"name": "é日本🙂', 1)),
    ("exponent time", lambda t: t.replace('"dur": ', '"dur": 1E+1, "x": ', 1)),
    (
        "long fraction",
        lambda t: t.replace('"dur": ', '"dur": 0.1000000000000000055511151231257827, "x": ', 1),
    ),
    ("many digits", lambda t: t.replace('"ts": ', '"ts": 1661203462598738.123456789, "x": ', 1)),
    ("tiny", lambda t: t.replace('"dur": ', '"dur": 4.9e-324, "x": ', 1)),
    ("huge", lambda t: t.replace('"dur": ', '"dur": 1e400, "x": ', 1)),
    ("negative zero", lambda t: t.replace('"dur": ', '"dur": -0.0, "x": ', 1)),
    ("big int time", lambda t: t.replace('"ts": ', '"ts": 9007199254740993, "x": ', 1)),
    ("id past 64 bits", lambda t: t.replace('"args": {', '"args": {"stream": 123456789012345678901234, ', 1)),
    ("id as float", lambda t: t.replace('"args": {', '"args": {"device": 2.0, ', 1)),
    ("id as string", lambda t: t.replace('"args": {', '"args": {"correlation": "17", ', 1)),
    (
        "upper external null",
        lambda t: t.replace('"args": {', '"args": {"External id": null, "external id": 4, ', 1),
    ),
    ("lower external only", lambda t: t.replace('"External id"', '"external id"', 1)),
    ("args null", lambda t: t.replace('"args": {', '"args": null, "x": {', 1)),
    ("args list", lambda t: t.replace('"args": {', '"args": [1], "x": {', 1)),
    ("name a number", lambda t: t.replace('"name": ', '"name": 7, "x": ', 1)),
    ("category null", lambda t: t.replace('"cat": ', '"cat": null, "x": ', 1)),
    ("no category", lambda t: t.replace('"cat": ', '"x": ', 1)),
    ("unknown phase", lambda t: t.replace('"ph": "X"', '"ph": "Q"', 1)),
    ("phase escaped", lambda t: t.replace('"ph": "X"', '"ph": "\\u0058"', 1)),
    ("deep", lambda t: t.replace('"args": {', '"args": {"d": ' + "[" * 70 + "]" * 70 + ", ", 1)),
    ("white space", lambda t: t.replace(", ", " ,\t\r\n ").replace(": ", "  :  ")),
    ("control character", lambda t: t.replace('"name": "', '"name": "\t', 1)),
    ("bad literal", lambda t: t.replace('"args": {', '"args": {"x": tru, ', 1)),
    ("leading zero", lambda t: t.replace('"args": {', '"args": {"x": 012, ', 1)),
    ("bare fraction", lambda t: t.replace('"args": {', '"args": {"x": 1., ', 1)),
    ("string quoted time", lambda t: t.replace('"ts": ', '"ts": "12.5", "x": ', 1)),
]


def _spelled(tmp_path: Path, what: str, spell: Any) -> Path:
    """A trace (~1.7 MiB: two chunks) with one spelling in a few complete events."""
    rng = random.Random(what)
    doc = kr.job(2, steps=30, kernels=12, padding_ops=400)[0]
    texts = []
    for ev in doc["traceEvents"]:
        text = json.dumps(ev)
        if ev.get("ph") == "X" and "args" in ev and "dur" in ev and rng.random() < 0.01:
            text = spell(text)
        texts.append(text)
    path = tmp_path / f"{what.replace(' ', '_')}.json"
    path.write_text('{"traceEvents": [\n' + ",\n".join(texts) + "\n]}", encoding="utf-8")
    return path


@pytest.mark.parametrize(("what", "spell"), SPELLINGS, ids=[what for what, _ in SPELLINGS])
def test_every_spelling_reads_as_msgspec_reads_it(tmp_path: Path, what: str, spell: Any) -> None:
    text, structs, python = _three(_spelled(tmp_path, what, spell))
    assert text == structs == python


def _loop() -> Any:
    return events._EventLoop(events.TraceColumns(path=Path("t.json"))).fast


@pytest.mark.parametrize(
    "chunk",
    [
        b'[{"ph": "X", "ts": 1, "ts": 2}]',  # a duplicate: msgspec keeps the last
        b'[{"ph": "X", "\\u0074s": 1}]',  # an escaped key may spell a field
        b'[{"ph": "X", "ts": 1, "name": "a\\u0062"}]',  # an escaped name
        b'[{"ph": "X", "ts": "1"}]',  # a quoted time: the untagged decoder converts it
        b'[{"ph": "X", "ts": 9007199254740993}]',  # an int past 2**52: the Python loop's
        b'[{"ph": "X", "ts": 1, "args": [1]}]',
        b'[{"ph": "X", "ts": 1, "x": "\\ud800"}]',  # a lone surrogate: msgspec refuses it
        b'[{"ph": "X", "ts": 1, "x": NaN}]',
        b'[{"ph": "X", "ts": 1, "x": "a\tb"}]',  # a raw control character
        b'[{"ph": "X", "ts": 1} {"ph": "X", "ts": 2}]',
        b'[{"ph": "X", "ts": 1},]',
        b'[{"ph": "Q", "ts": 1}]',  # not a Trace Event Format phase
        b'[{"ts": 1}]',  # no phase
        b"[1]",
        b'[{"ph": "X", "ts": 1, "x": -}]',
        b'[{"ph": "X", "ts": 1, "x": 1e}]',
    ],
)
def test_it_declines_what_it_cannot_read_as_msgspec(chunk: bytes) -> None:
    loop = _loop()
    assert loop.take_text(chunk) is None
    assert loop.state()[3:5] == (0, 0)  # nothing was counted


def test_it_takes_kineto_events_and_skips_other_phases() -> None:
    chunk = (
        b'[{"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 1.5, "dur": 2, "args": {"External id": 3}},'
        b' {"ph": "s", "id": 1, "ts": "odd", "cat": ["any"], "args": 5},'
        b' {"ph": "X", "cat": "Kernel", "name": "k", "ts": 4, "dur": 1e0, "args": {"stream": 7, "correlation": 9}},'
        b' {"ph": "X", "cat": "cpu_op", "name": "neg", "ts": 4, "dur": -1}]'
    )
    loop = _loop()
    assert loop.take_text(chunk) == (4, 4)
    open_ts, open_end, _, bad, negative, _ = loop.state()
    assert (open_ts, open_end, bad, negative) == (1.5, 3.5, 0, 1)
