"""A trace's columns as comparable facts, and traces with odd values in every field: what the tests of the
trace reader's paths (msgspec / stdlib, C / Python loop) compare."""

from __future__ import annotations

import dataclasses
import json
import random
from array import array
from pathlib import Path
from typing import Any

from tests import kineto_ranks as kr

ODD = [None, True, False, "12.5", "abc", 7, -3, 2.5, [], {}, [1], {"a": 1}, -0.0, "1e300", "", "X", 1e300]
ARG_KEYS = ["stream", "device", "correlation", "External id", "bytes", "Input type", "dtype", "Group size"]


def facts(cols: Any) -> Any:
    """The columns as plain comparable values (arrays by their bytes: -0.0 and NaN compare exactly)."""
    if dataclasses.is_dataclass(cols):
        return {f.name: facts(getattr(cols, f.name)) for f in dataclasses.fields(cols) if f.name != "path"}
    if isinstance(cols, array):
        return (cols.typecode, cols.tobytes())
    if isinstance(cols, dict):
        return sorted((str(k), facts(v)) for k, v in cols.items())
    if isinstance(cols, list | tuple):
        return [facts(v) for v in cols]
    if isinstance(cols, set):
        return sorted(cols)
    return cols


def odd_trace(path: Path, seed: int) -> Path:
    """A 2-rank job's trace (~3.5 MiB) with odd values planted by `seed`: missing keys, quoted numbers,
    booleans, nulls, non-object items, the lower-case "external id"."""
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
