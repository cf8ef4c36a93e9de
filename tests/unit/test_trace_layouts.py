"""A trace reads the same whatever its valid JSON layout (issue 26): the golden traces re-written minified,
one line as ``json.dump`` writes it, with indent 2, CRLF line ends, a UTF-8 BOM, as a bare array of events,
and in three gzip members cut mid-event give bit-identical columns and summaries; the read stays one pass
(each byte scanned once, no value-by-value fallback) and keeps its limits in every layout."""

from __future__ import annotations

import gzip
import random
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import msgspec
import pytest
from tests.trace_facts import facts

from pitstop.artifacts import IngestError
from pitstop.ingest.detect import sniff
from pitstop.trace import jsonstream, load_trace
from pitstop.trace.boundaries import scan_python
from pitstop.trace.events import read_columns

KEYS = ("control", "ns_resolution", "nccl_data", "negative_queue", "mi250")
METADATA = (
    "rank",
    "world_size",
    "device_names",
)  # read from the keys beside the events: a bare array has none


def _members(text: bytes) -> bytes:
    """The text in three gzip members, cut at offsets that fall inside events."""
    cuts = [0, len(text) // 3 + 7, 2 * len(text) // 3 + 13, len(text)]
    return b"".join(gzip.compress(text[a:b], 1) for a, b in pairwise(cuts))


LAYOUTS: dict[str, Callable[[bytes], bytes]] = {
    "minified": lambda t: msgspec.json.format(t, indent=-1),
    "one_line": lambda t: msgspec.json.format(t, indent=0),  # json.dump's separators
    "indent_2": lambda t: msgspec.json.format(t, indent=2),
    "crlf": lambda t: t.replace(b"\n", b"\r\n"),  # a raw newline never occurs inside a JSON string
    "bom": lambda t: b"\xef\xbb\xbf" + t,
    "bare_array": lambda t: bytes(msgspec.json.decode(t, type=dict[str, msgspec.Raw])["traceEvents"]),
}


def _without_metadata(cols: Any) -> Any:
    for name in METADATA:
        setattr(cols, name, None)
    return facts(cols)


@pytest.mark.parametrize("key", KEYS)
def test_every_layout_reads_bit_identical(shared_data: Path, tmp_path: Path, key: str) -> None:
    original = next((shared_data / "traces").glob(f"*{key}*.gz"))
    text = gzip.decompress(original.read_bytes())
    assert text.count(b"},\n") > 10  # Kineto's layout: the one the reader was first written for
    columns, summary = facts(read_columns(original)), facts(load_trace(original))
    assert read_columns(original).events > 0
    plain = _without_metadata(read_columns(original))
    variants = {name: make(text) for name, make in LAYOUTS.items()}
    variants["gzip_members"] = _members(text)
    for name, data in variants.items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(data)
        assert data != text and sniff(path)[0] == "kineto_trace", name
        if name == "bare_array":
            assert _without_metadata(read_columns(path)) == plain, name
        else:
            assert facts(read_columns(path)) == columns, name
            if name in ("minified", "bom", "gzip_members"):  # one summary per reading path (costly)
                assert facts(load_trace(path)) == summary, name


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Bytes the boundary scan went over and values read one by one, for the next read."""
    counts = {"scanned": 0, "values": 0}
    real_scanner, real_value = jsonstream.scanner, jsonstream._Reader.value

    def scanner() -> Any:
        scan = real_scanner()

        def counted(text: Any, start: int, *state: int) -> tuple[int, int, int, int]:
            out = scan(text, start, *state)
            counts["scanned"] += out[1] - start
            return out

        return counted

    def value(self: Any) -> Any:
        counts["values"] += 1
        return real_value(self)

    monkeypatch.setattr(jsonstream, "scanner", scanner)
    monkeypatch.setattr(jsonstream._Reader, "value", value)
    return counts


@pytest.mark.parametrize("layout", ["minified", "bare_array"])
def test_one_line_is_one_pass(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    """The regression behind issue 26: a trace without newlines was read value by value (quadratic)."""
    text = LAYOUTS[layout](
        gzip.decompress(next((shared_data / "traces").glob("*nccl_data*.gz")).read_bytes())
    )
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(text, 1))
    counts = _counting(monkeypatch)
    events = read_columns(path).events
    assert events > 10_000
    assert counts["scanned"] <= len(text)  # each byte once
    keys = 0 if layout == "bare_array" else len(msgspec.json.decode(text, type=dict[str, msgspec.Raw]))
    assert counts["values"] <= 2 * keys + 1  # the keys and values beside the events, and the last event


def test_python_scan_matches_the_c_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scan = pytest.importorskip("pitstop.trace._eventloop").scan
    rng = random.Random(26)
    for alphabet in (b'{}[],"\\ a1:', b'{}[],"  aaaaaaa1:'):  # the C scan takes 64 bytes at a time
        for _ in range(3000):
            text = bytes(rng.choice(alphabet) for _ in range(rng.randrange(300)))
            start, depth, state = rng.randrange(70), rng.randrange(3), rng.randrange(3)
            assert scan(text, start, depth, state, 6) == scan_python(text, start, depth, state, 6), text
    events = [{"ph": "X", "cat": "kernel", "name": f'k\\"{i},]}}', "ts": i, "dur": 1} for i in range(3000)]
    path = tmp_path / "t.json"
    path.write_bytes(msgspec.json.encode(events))
    with_c = facts(read_columns(path))
    monkeypatch.setenv("PITSTOP_TRACE_LOOP", "python")
    assert facts(read_columns(path)) == with_c
    assert len(read_columns(path).kernels) == 3000


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b'[{"ph":"X","args":' + b"[" * 40_000 + b"]" * 40_000 + b"}]", "nested too deeply"),
        (b'{"traceEvents":[{"ph":"X","name":"' + b"k" * (40 << 20) + b'"}]}', "longer than 32 MiB"),
        (b"\xef\xbb\xbf[" + b" " * (100 << 20) + b"]", "decompression bomb"),
        (b'[{"ph":"X","ts":1},{"ph":"X","ts":2}] {}', "text after the array"),
        (b'[{"ph":"X","ts":1},{"ph":"X","ts":NaN}]', "NaN is not a JSON number"),
    ],
    ids=["deep", "giant", "bomb", "trailing", "nan"],
)
def test_limits_hold_in_one_line_layouts(tmp_path: Path, text: bytes, message: str) -> None:
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(text, 9))
    with pytest.raises(IngestError, match=message):
        read_columns(path)
