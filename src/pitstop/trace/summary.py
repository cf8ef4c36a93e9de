"""One rank's trace reduced to what the cross-rank step needs: its RankProfile and its collectives.

This is the task a worker process (or a Dask worker) runs per trace; the result is small (a RankProfile of a
few KB plus a handful of numbers per NCCL kernel) and pickles cheaply, whatever the trace's size.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pitstop.artifacts import IngestError
from pitstop.core.profile import RankProfile
from pitstop.trace import profile_of
from pitstop.trace.events import read_columns

_RANK_IN_NAME = re.compile(r"(?:rank|worker|node)[-_.]?(\d+)", re.I)


def rank_from_name(path: Path) -> int | None:
    """``rank-3.json``, ``worker3.pt.trace.json.gz``, ``node_0_rank_5...``: the last rank-like number."""
    found = _RANK_IN_NAME.findall(path.name)
    return int(found[-1]) if found else None


@dataclass
class RankSummary:
    path: str
    profile: RankProfile
    # one entry per NCCL / RCCL kernel inside a step: aligned step number, sequence number among the
    # collectives of the same (step, group, kind), kind code, start, end (us), message bytes, group size
    coll: dict[str, np.ndarray] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)  # coll["group"] indexes this
    seconds: float = 0.0

    @property
    def rank(self) -> int:
        return self.profile.rank


@dataclass
class Failure:
    path: str
    message: str


def summarize(path: str, fallback_rank: int) -> RankSummary | Failure:
    """Read one trace; an unreadable one becomes a Failure (reported and skipped, never fatal)."""
    start = time.perf_counter()
    try:
        cols = read_columns(Path(path))
    except IngestError as exc:
        return Failure(path, str(exc).removeprefix(f"{path}: "))
    except MemoryError:
        return Failure(path, "out of memory while reading it")
    profile, view = profile_of(cols, fallback_rank)
    c = cols.collectives
    ts = np.frombuffer(c.ts, dtype=np.float64)
    end = np.frombuffer(c.end, dtype=np.float64)
    kind = np.frombuffer(c.kind, dtype=np.int64)
    group = np.frombuffer(c.group, dtype=np.int64)
    step = np.full(ts.size, -1, dtype=np.int64)
    if view.steps and ts.size:
        lo = np.array([s.start for s in view.steps])
        hi = np.array([s.end for s in view.steps])
        idx = np.searchsorted(lo, ts, side="right") - 1
        inside = (idx >= 0) & (ts < hi[np.clip(idx, 0, None)])
        numbers = np.array([s.number for s in view.steps], dtype=np.int64)
        step[inside] = numbers[idx[inside]]
    keep = step >= 0
    order = np.lexsort((ts[keep], kind[keep], group[keep], step[keep]))
    coll: dict[str, Any] = {
        "step": step[keep][order],
        "group": group[keep][order],
        "kind": kind[keep][order],
        "ts": ts[keep][order],
        "end": end[keep][order],
        "nbytes": np.frombuffer(c.nbytes, dtype=np.float64)[keep][order],
        "group_size": np.frombuffer(c.group_size, dtype=np.int64)[keep][order],
    }
    coll["seq"] = _sequence(coll["step"], coll["group"], coll["kind"])
    return RankSummary(path, profile, coll, list(cols.comm_groups), time.perf_counter() - start)


def _sequence(*keys: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... within each run of equal keys (the arrays are sorted by them)."""
    n = keys[0].size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    new = np.ones(n, dtype=bool)
    new[1:] = np.zeros(n - 1, dtype=bool)
    for k in keys:
        new[1:] |= k[1:] != k[:-1]
    starts = np.flatnonzero(new)
    run = np.cumsum(new) - 1
    return np.arange(n, dtype=np.int64) - starts[run]
