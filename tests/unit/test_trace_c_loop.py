"""The C event loop (``_eventloop.c``) gives the Python loop's columns, to the last bit, on real traces and
on traces with odd values in every field; an event it leaves to Python hands over the rest of the trace with
the running state."""

from __future__ import annotations

import importlib
import json
import shutil
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from tests import kineto_ranks as kr
from tests.trace_facts import facts, odd_trace

from pitstop.trace import events
from pitstop.trace.events import read_columns


def _both(path: Path) -> tuple[Any, Any]:
    def read(c_loop: bool) -> Any:
        try:
            cols = read_columns(path, c_loop=c_loop)
        except Exception as exc:  # an odd value may end the read: both loops must end it the same way
            return (type(exc).__name__, str(exc))
        return facts(cols), list(cols.categories)  # the categories in the order they were first seen

    return read(True), read(False)


def _write(path: Path, trace_events: list[Any]) -> Path:
    path.write_text('{"traceEvents": [\n' + ",\n".join(json.dumps(ev) for ev in trace_events) + "\n]}")
    return path


def test_the_c_loop_is_built_where_there_is_a_compiler() -> None:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): pitstop reads traces with the Python loop")
    importlib.import_module("pitstop.trace._eventloop")  # make setup builds it (pip install -e)


def test_the_loops_agree_on_the_shared_traces(shared_data: Path) -> None:
    traces = sorted((shared_data / "traces").glob("*.json*"))
    assert traces
    for trace in traces:
        fast, python = _both(trace)
        assert fast == python, trace.name


@pytest.mark.parametrize("seed", range(6))
def test_the_loops_agree_on_odd_values(tmp_path: Path, seed: int) -> None:
    fast, python = _both(odd_trace(tmp_path / "odd.json", seed))
    assert fast == python


def test_memos_that_overflow_and_many_categories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Memos cleared while a batch is read (the C loop counts categories by the memo's string objects) and
    more categories in one batch than its table holds: the same counts, in the same order."""
    monkeypatch.setattr(events, "_MEMO_LIMIT", 3)
    doc = kr.job(2, steps=20, kernels=8, padding_ops=50)[0]
    trace_events: list[Any] = doc["traceEvents"]
    for i, ev in enumerate(trace_events):
        if i % 7 == 0 and ev.get("cat") == "cpu_op":
            ev["cat"] = f"Cat_{i % 300}"  # 300 categories, a few upper-case (the memo lower-cases them)
    fast, python = _both(_write(tmp_path / "many.json", trace_events))
    assert fast == python
    assert len(fast[1]) > 100


def test_an_event_left_to_python_hands_over_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A time that is an int past 2**52 (doubles no longer hold every sum of two): the Python loop takes
    that event and every later one, starting from the C loop's state (its open CPU interval, counters,
    GEMM times and vendor)."""
    doc = kr.job(2, steps=60, kernels=12, padding_ops=400)[0]
    trace_events: list[Any] = doc["traceEvents"]
    middle = len(trace_events) // 2
    odd = next(i for i in range(middle, len(trace_events)) if trace_events[i].get("cat") == "cpu_op")
    trace_events[odd] = {**trace_events[odd], "ts": 2**53 + 1, "dur": 3}
    path = _write(tmp_path / "late.json", trace_events)
    seen_by_python: list[int] = []
    take = events._EventLoop._take

    def counted(self: events._EventLoop, batch: list[Any]) -> None:
        seen_by_python.append(len(batch))
        take(self, batch)

    monkeypatch.setattr(events._EventLoop, "_take", counted)
    fast = read_columns(path)
    monkeypatch.setattr(events._EventLoop, "_take", take)
    assert facts(fast) == facts(read_columns(path, c_loop=False))
    if importlib.util.find_spec("pitstop.trace._eventloop") is not None:
        assert 0 < sum(seen_by_python) < len(trace_events) - odd + 1  # Python read from the odd event on
    assert fast.vendor == "nvidia" and len(fast.kernels) > 0


def test_structs_it_cannot_read_leave_every_event_to_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C loop reads msgspec's struct fields by their slot offsets; were a msgspec to keep them another
    way, the loop refuses to start and the Python loop reads the trace."""
    pytest.importorskip("pitstop.trace._eventloop")
    from pitstop.trace import fastevents

    class Fields:  # fields that are properties, not object slots
        cat = name = ts = dur = args = property(lambda self: None)

    cols = events.TraceColumns(path=Path("t.json"))
    assert events._EventLoop(cols).fast is not None
    monkeypatch.setattr(fastevents, "Event", Fields)
    assert events._EventLoop(cols).fast is None
