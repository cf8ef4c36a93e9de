"""Hostile traces cost bounded memory and end in one line and exit code 2 (issue 14, item 11); the reader's
peak memory barely moves as a trace grows.

Peak memory is the child's own high-water mark (VmHWM from /proc, Linux only): getrusage of a child
started by vfork + exec also counts the parent's pages.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from tests import kineto_ranks as kr

from pitstop.artifacts import IngestError
from pitstop.trace.events import read_columns

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")

_HWM = (
    "import atexit, re, sys\n"
    "def hwm(out=sys.argv[1]):\n"
    "    text = open('/proc/self/status').read()\n"
    "    open(out, 'w').write(re.search(r'VmHWM:\\s+(\\d+)', text).group(1))\n"
    "atexit.register(hwm)\n"
)
CLI = _HWM + "sys.argv = ['pitstop', *sys.argv[2:]]\nfrom pitstop.cli.app import main\nmain()\n"
WORKER = (
    _HWM
    + "from pitstop.trace.summary import summarize\nprint(len(summarize(sys.argv[2], 0).profile.steps))\n"
)


def _run(script: str, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """(the process, its peak resident memory in MiB)."""
    hwm = tmp_path / "hwm"
    proc = subprocess.run(
        [sys.executable, "-c", script, str(hwm), *args], capture_output=True, text=True, timeout=600
    )
    return proc, int(hwm.read_text()) / 1024


def _gzip_stream(path: Path, parts: list[tuple[bytes, int]]) -> Path:
    """A gzip of each piece repeated so many times, written without ever holding the whole text."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    with path.open("wb") as f:
        for piece, times in parts:
            per_block = max(1, (1 << 20) // len(piece))
            full, rest = divmod(times, per_block)
            block = piece * per_block
            for _ in range(full):
                f.write(comp.compress(block))
            f.write(comp.compress(piece * rest))
        f.write(comp.flush())
    return path


def _refused(tmp_path: Path, path: Path, message: str, limit_mib: float) -> None:
    proc, peak = _run(CLI, tmp_path, "analyze", str(path), "--no-history")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert peak < limit_mib, f"peak {peak:.0f} MiB"


@pytest.mark.slow
def test_deep_nesting(tmp_path: Path) -> None:
    """The 138-byte gzip of 40,000 nested brackets that took 4 GB."""
    path = tmp_path / "deep.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": ' + b"[" * 40_000 + b"]" * 40_000 + b"}", 9))
    assert len(path.read_bytes()) < 200
    _refused(tmp_path, path, "nested too deeply", 200)
    inner = tmp_path / "inner.json"  # deep inside one event, after good ones
    event = json.dumps({"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1})
    inner.write_text(
        '{"traceEvents": [' + event + ",\n" + '{"args": ' + "[" * 100_000 + "]" * 100_000 + "}]}"
    )
    with pytest.raises(IngestError, match="nested too deeply"):
        read_columns(inner)


@pytest.mark.slow
def test_giant_string(tmp_path: Path) -> None:
    """A ~200 KB gzip whose one kernel name is 200 MB (it ran past 60 s)."""
    head = b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "dur": 2, "name": "'
    path = _gzip_stream(tmp_path / "giant.json.gz", [(head, 1), (b"k", 200 << 20), (b'"}]}', 1)])
    assert path.stat().st_size < 400_000
    _refused(tmp_path, path, "longer than 32 MiB", 300)


@pytest.mark.slow
def test_gzip_bomb(tmp_path: Path) -> None:
    """Whitespace inside the event list expands ~1,000x: refused once the ratio is past any trace's."""
    path = _gzip_stream(tmp_path / "bomb.json.gz", [(b'{"traceEvents": [', 1), (b" ", 300 << 20), (b"]}", 1)])
    _refused(tmp_path, path, "decompression bomb", 200)


@pytest.mark.slow
def test_non_numbers(tmp_path: Path) -> None:
    nan = tmp_path / "nan.json"
    nan.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": NaN, "dur": 1}]}')
    _refused(tmp_path, nan, "NaN is not a JSON number", 200)
    huge = tmp_path / "huge.json"  # 1e400 is valid JSON and parses as infinity: skipped and counted
    doc = kr.job(1, steps=3)[0]
    doc["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1})
    text = json.dumps(doc).replace('"ts": 1, "dur": 1}', '"ts": 1e400, "dur": 1}')
    huge.write_text(text)
    cols = read_columns(huge)
    assert cols.bad_events == 1 and len(cols.steps) == 3
    digits = tmp_path / "digits.json"  # an integer Python refuses to convert (past 4,300 digits): one line
    digits.write_text(
        '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": ' + "9" * 5000 + "}]}"
    )
    _refused(tmp_path, digits, "an integer longer than 40 digits", 200)


@pytest.mark.slow
def test_worker_memory_stays_flat_as_the_trace_grows(tmp_path: Path) -> None:
    """The same job profiled for 7x more steps: 7x the text, the worker's peak moves by a few MiB."""
    sizes, peaks = [], []
    for steps in (40, 280):
        doc = kr.job(1, steps=steps, kernels=60, padding_ops=1500)[0]
        path = kr.write(doc, tmp_path / f"r{steps}.json")
        del doc
        proc, peak = _run(WORKER, tmp_path, str(path))
        assert proc.returncode == 0 and proc.stdout.strip() == str(steps), proc.stderr[-2000:]
        sizes.append(path.stat().st_size / 2**20)
        peaks.append(peak)
        path.unlink()
    grown = sizes[1] - sizes[0]
    assert grown > 40  # MiB of trace text added
    assert peaks[1] - peaks[0] < 0.1 * grown, (sizes, peaks)


def test_an_event_whose_category_is_not_a_string_is_counted_as_malformed(tmp_path: Path) -> None:
    from pitstop.trace.events import read_columns

    events = [
        {"ph": "X", "cat": ["x"], "name": "k", "ts": 1, "dur": 2, "pid": 1, "tid": 1},
        {"ph": "X", "cat": {"a": 1}, "name": "k", "ts": 1, "dur": 2, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "pid": 0, "tid": 7},
    ]
    path = tmp_path / "cat.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    columns = read_columns(path)
    assert columns.bad_events == 2  # skipped and counted, never an internal error


@pytest.mark.slow
def test_ids_past_64_bits_are_unknown_not_an_internal_error(tmp_path: Path) -> None:
    big = 2**64
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 100, "dur": 5, "pid": 0, "tid": 7,
         "args": {"stream": big, "correlation": big, "device": -big, "External id": 2**63}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 95, "dur": 3, "pid": 1, "tid": 1,
         "args": {"correlation": big}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 90, "dur": 20, "pid": 1, "tid": 1,
         "args": {"External id": 2**63}},
    ]  # fmt: skip
    path = tmp_path / "big-ids.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    columns = read_columns(path)
    assert list(columns.kernels.correlation) == [-1] and list(columns.kernels.stream) == [-1]
    proc = subprocess.run(
        [sys.executable, "-m", "pitstop", "analyze", str(path)], capture_output=True, text=True, timeout=120
    )
    assert "internal error" not in proc.stdout + proc.stderr and proc.returncode in (0, 2), proc.stderr


@pytest.mark.parametrize("isal", [True, False], ids=["isal", "stdlib-gzip"])
def test_both_inflaters_read_the_same_and_refuse_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isal: bool
) -> None:
    """ISA-L inflates where installed, the stdlib's gzip elsewhere: same columns, same one-line refusals."""
    if isal:
        pytest.importorskip("isal")
    else:
        monkeypatch.setitem(sys.modules, "isal", None)  # import isal raises ImportError
    doc = kr.job(2, steps=20, kernels=8)[0]
    text = ('{"traceEvents": [\n' + ",\n".join(json.dumps(ev) for ev in doc["traceEvents"]) + "\n]}").encode()
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_bytes(text)
    packed.write_bytes(gzip.compress(text))
    assert read_columns(packed).kernels == read_columns(plain).kernels
    assert len(read_columns(packed).kernels) > 0
    whole = packed.read_bytes()
    for name, data, message in (
        ("cut.json.gz", whole[: len(whole) // 2], "truncated or corrupt gzip"),
        ("flipped.json.gz", whole[:40] + bytes(b ^ 0xFF for b in whole[40:80]) + whole[80:], "corrupt gzip"),
    ):
        bad = tmp_path / name
        bad.write_bytes(data)
        with pytest.raises(IngestError, match=message):
            read_columns(bad)
