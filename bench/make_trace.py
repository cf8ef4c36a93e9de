"""Grow a real Kineto trace to a target size by repeating its events later in time.

Each copy is shifted past the previous one, and its correlation ids, external ids and ProfilerStep numbers
are renumbered, so the result is a longer, valid trace of the same run (a copy is not an exact profile of
the same steps, but it has the same event mix, which is what parsing speed and memory depend on).

    python bench/make_trace.py ../shared/data/traces/hta__trace_diff__control__control.json.gz big.json --mb 1024

With --ranks N the target is a folder of N rank traces made from one real trace (by text substitution, ~0.1 s
a rank): each rank's clock is shifted by a random offset (--skew-us), its distributedInfo says its rank, and
one planted straggler (--straggler, default N // 3) reaches every NCCL kernel --late-us after the others,
who wait for it (their NCCL kernels start that much earlier and last that much longer):

    python bench/make_trace.py ../shared/data/traces/hta__nccl_parser_config__nccl_data.json.gz ranks64/ --ranks 64
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

STEP = re.compile(r"^ProfilerStep#(\d+)$")


def load(path: Path) -> dict[str, Any]:
    """The trace, its fractional numbers as Decimals: the copies keep the source's number text (Kineto writes
    integer microseconds, or three decimals at ns resolution). A float shift would write times such as
    "1661203462598738.0", which no profiler writes and msgspec parses ~6x slower (an exactly representable
    decimal takes its slow path)."""
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rt") as f:  # type: ignore[operator]
        return json.load(f, parse_float=Decimal)


_DECIMAL = re.compile(r'"@(-?[0-9.]+(?:E[-+]?[0-9]+)?)@"')


def dumps(value: Any) -> str:
    """JSON text with each Decimal written as the number it is (json writes unknown types as strings)."""
    text = json.dumps(value, default=lambda d: f"@{d}@" if isinstance(d, Decimal) else d)
    return _DECIMAL.sub(r"\1", text)


def shifted(event: dict[str, Any], copy: int, span: Decimal | int, ids: int, steps: int) -> dict[str, Any]:
    e = dict(event)
    if isinstance(e.get("ts"), int | Decimal):
        e["ts"] = e["ts"] + copy * span
    args = e.get("args")
    if isinstance(args, dict):
        args = dict(args)
        for key in ("correlation", "External id", "external id"):
            if isinstance(args.get(key), int) and args[key] >= 0:
                args[key] = args[key] + copy * ids
        e["args"] = args
    if isinstance(e.get("id"), int):
        e["id"] = e["id"] + copy * ids
    m = STEP.match(str(e.get("name", "")))
    if m:
        e["name"] = f"ProfilerStep#{int(m.group(1)) + copy * steps}"
    return e


def grow(source: Path, target: Path, megabytes: float) -> int:
    trace = load(source)
    events = trace.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), int | Decimal)]
    span = max(e["ts"] + (e.get("dur") or 0) for e in timed) - min(e["ts"] for e in timed) + 1000
    ids = 1 + max(
        (
            v
            for e in events
            for k, v in (e.get("args") or {}).items()
            if k in ("correlation", "External id") and isinstance(v, int)
        ),
        default=0,
    )
    steps = 1 + max((int(m.group(1)) for e in events if (m := STEP.match(str(e.get("name", ""))))), default=0)
    budget = int(megabytes * 2**20)
    written = 0
    copies = 0
    with target.open("w") as out:
        head = dumps(trace)[:-1]
        out.write(head + (", " if trace else "") + '"traceEvents": [\n')
        first = True
        while written < budget:
            for event in events:
                text = dumps(shifted(event, copies, span, ids, steps))
                out.write(("" if first else ",\n") + text)
                first = False
                written += len(text) + 2
            copies += 1
        out.write("\n]}\n")
    return copies


_NCCL_TIMES = re.compile(r'("name": "nccl[^"]*Kernel[^"]*",[^\n]*\n\s*"ts": )([-\d.]+), "dur": ([-\d.]+)')
_TS = re.compile(r'("ts": )(-?\d+(?:\.\d+)?)')
_DIST = re.compile(r'"distributedInfo": \{"backend": "(\w+)", "rank": \d+, "world_size": \d+')


def rank_folder(
    source: Path, target: Path, ranks: int, straggler: int, late_us: float, skew_us: float
) -> None:
    """N gzipped rank traces from one (Kineto's own layout is kept: the substitutions rely on it)."""
    opener = gzip.open if source.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(source, "rt") as f:  # type: ignore[operator]
        text = f.read()
    if not _NCCL_TIMES.search(text):
        raise SystemExit(f"{source}: no NCCL kernels to plant a straggler on")
    target.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    for rank in range(ranks):
        offset = 0.0 if rank == 0 else rng.uniform(-skew_us, skew_us)
        body = text
        if rank != straggler:  # the others arrive late_us earlier and wait
            body = _NCCL_TIMES.sub(
                lambda m: (
                    f'{m.group(1)}{float(m.group(2)) - late_us:.3f}, "dur": {float(m.group(3)) + late_us:.3f}'
                ),
                body,
            )
        body = _TS.sub(lambda m, off=offset: f"{m.group(1)}{float(m.group(2)) + off:.3f}", body)
        body = _DIST.sub(
            lambda m, r=rank: (
                f'"distributedInfo": {{"backend": "{m.group(1)}", "rank": {r}, "world_size": {ranks}'
            ),
            body,
        )
        with gzip.open(target / f"rank-{rank}.pt.trace.json.gz", "wt", compresslevel=1) as out:
            out.write(body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--mb", type=float, default=256)
    parser.add_argument("--ranks", type=int, default=0, help="make a folder of this many rank traces")
    parser.add_argument("--straggler", type=int, default=None)
    parser.add_argument("--late-us", type=float, default=3000.0)
    parser.add_argument("--skew-us", type=float, default=800.0)
    args = parser.parse_args()
    if args.ranks:
        straggler = args.ranks // 3 if args.straggler is None else args.straggler
        rank_folder(args.source, args.target, args.ranks, straggler, args.late_us, args.skew_us)
        print(f"{args.target}: {args.ranks} ranks, straggler {straggler}")
        return 0
    copies = grow(args.source, args.target, args.mb)
    print(
        f"{args.target}: {args.target.stat().st_size / 2**20:.0f} MiB, {copies} copies of {args.source.name}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
