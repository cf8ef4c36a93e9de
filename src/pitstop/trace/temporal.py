"""GPU time split the way Holistic Trace Analysis splits it: idle / compute / non-compute, and idle time
split into host wait, kernel wait and other.

* The events: everything on a GPU stream (kernels, copies, sets, stream syncs), with HTA's rounding of
  fractional-microsecond traces (start rounded up, end down) and, when the trace holds several profiler
  steps, without the last step (the events launched from the host before it began).
* Temporal breakdown over the span from the first to the last GPU event: idle = span − union of all GPU
  events; compute = union of compute kernels (neither communication, memory nor sync); non-compute = the
  rest of the busy time.
* Idle split, per stream: a gap before an event whose launch came after the previous event ended is host
  wait (the GPU waited for the CPU); otherwise a gap shorter than 30 µs is kernel wait (back-to-back kernel
  overhead); anything else is other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pitstop.trace.events import COMPUTE, MEMORY_KERNEL, GpuColumns, TraceColumns
from pitstop.trace.intervals import length, sorted_unique, union

KERNEL_WAIT_US = 30.0


@dataclass
class Temporal:
    span_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float
    host_wait_us: float
    kernel_wait_us: float
    other_wait_us: float

    def shares(self) -> dict[str, float]:
        span = self.span_us or 1.0
        return {
            "idle": self.idle_us / span,
            "compute": self.compute_us / span,
            "non_compute": self.non_compute_us / span,
        }

    def idle_split(self) -> dict[str, float]:
        total = self.host_wait_us + self.kernel_wait_us + self.other_wait_us
        if total <= 0:
            return {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
        return {
            "host_wait": self.host_wait_us / total,
            "kernel_wait": self.kernel_wait_us / total,
            "other": self.other_wait_us / total,
        }


def _round(ts: np.ndarray, end: np.ndarray, fractional: bool) -> tuple[np.ndarray, np.ndarray]:
    if not fractional:
        return ts, end
    return np.ceil(ts), np.floor(end)


def _gpu_table(cols: TraceColumns) -> dict[str, np.ndarray]:
    """All events on a GPU stream: start, end, stream, correlation, compute flag, part of the idle split."""
    parts: list[tuple[GpuColumns, np.ndarray | None, bool]] = [
        (cols.kernels, np.frombuffer(cols.kernels.code, dtype=np.int8), True),
        (cols.memcpy, None, True),
        (cols.memset, None, True),
        (cols.gpu_other, None, False),
    ]
    out: dict[str, list[np.ndarray]] = {
        k: [] for k in ("ts", "end", "stream", "corr", "compute", "idle_split")
    }
    for part, codes, in_split in parts:
        n = len(part)
        if n == 0:
            continue
        out["ts"].append(np.frombuffer(part.ts, dtype=np.float64))
        out["end"].append(np.frombuffer(part.end, dtype=np.float64))
        out["stream"].append(np.frombuffer(part.stream, dtype=np.int64))
        out["corr"].append(np.frombuffer(part.correlation, dtype=np.int64))
        out["compute"].append(codes == COMPUTE if codes is not None else np.zeros(n, dtype=bool))
        out["idle_split"].append(np.full(n, in_split))
    table = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in out.items()}
    keep = table["stream"] >= 0 if table["stream"].size else np.zeros(0, dtype=bool)
    return {k: v[keep] for k, v in table.items()}


def temporal(cols: TraceColumns) -> Temporal | None:
    gpu = _gpu_table(cols)
    if gpu["ts"].size == 0:
        return None
    rt_ts = np.frombuffer(cols.runtime.ts, dtype=np.float64)
    rt_corr = np.frombuffer(cols.runtime.correlation, dtype=np.int64)
    fractional = bool(np.any(gpu["ts"] != np.floor(gpu["ts"]))) or bool(np.any(rt_ts != np.floor(rt_ts)))
    ts, end = _round(gpu["ts"], gpu["end"], fractional)
    rt_round = np.ceil(rt_ts) if fractional else rt_ts
    keep = np.ones(ts.size, dtype=bool)
    step_starts = sorted({start for _, start, _ in cols.steps})
    if len({n for n, _, _ in cols.steps}) >= 2:
        last = np.ceil(step_starts[-1]) if fractional else step_starts[-1]
        launched_before = sorted_unique(rt_corr[(rt_round < last) & (rt_corr >= 0)])
        if launched_before.size:  # membership by binary search: np.isin would sort both arrays together
            pos = np.minimum(np.searchsorted(launched_before, gpu["corr"]), launched_before.size - 1)
            keep = launched_before[pos] == gpu["corr"]
        del launched_before
    ts, end = ts[keep], end[keep]
    if ts.size == 0:
        return None
    compute = gpu["compute"][keep]
    busy_s, busy_e = union(ts, end)
    span = float(busy_e.max() - busy_s.min())
    idle = span - length(busy_s, busy_e)
    comp = length(*union(ts[compute], end[compute]))
    host, kernel, other = _idle_split(
        cols, ts, end, gpu["stream"][keep], gpu["corr"][keep], gpu["idle_split"][keep], rt_corr, rt_round
    )
    return Temporal(span, idle, comp, span - comp - idle, host, kernel, other)


def _last_launch(rt_corr: np.ndarray, rt_ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Launch time of each correlation id (the last call that carries it), as sorted arrays.

    What ``np.unique(rt_corr[::-1], return_index=True)`` gave, in about half its memory (it copies the
    input and keeps the permutation and the sorted copy at once: ~70 MB at 2 GB of trace, the analyses'
    peak); ids already in order, as Kineto numbers them, are not sorted at all."""
    if rt_corr.size == 0:
        return rt_corr, rt_ts
    if bool(np.all(rt_corr[1:] >= rt_corr[:-1])):
        order = None
        ordered = rt_corr
    else:
        order = np.argsort(rt_corr, kind="stable")  # equal ids keep their order: the last is the last call
        ordered = rt_corr[order]
    is_last = np.empty(ordered.size, dtype=bool)
    is_last[-1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=is_last[:-1])
    keys = ordered[is_last]
    del ordered
    at = np.flatnonzero(is_last) if order is None else order[is_last]
    return keys, rt_ts[at]


def _idle_split(
    cols: TraceColumns,
    ts: np.ndarray,
    end: np.ndarray,
    stream: np.ndarray,
    corr: np.ndarray,
    eligible: np.ndarray,
    rt_corr: np.ndarray,
    rt_ts: np.ndarray,
) -> tuple[float, float, float]:
    keys, launch_ts = _last_launch(rt_corr, rt_ts)
    host: list[np.ndarray] = []
    kernel: list[np.ndarray] = []
    other: list[np.ndarray] = []
    for s in sorted_unique(stream[eligible]).tolist():
        mask = eligible & (stream == s)
        order = np.argsort(ts[mask], kind="stable")
        s_ts, s_end, s_corr = ts[mask][order], end[mask][order], corr[mask][order]
        prev_end = s_end[:-1]
        gap = s_ts[1:] - prev_end
        if keys.size:
            pos = np.minimum(np.searchsorted(keys, s_corr[1:]), keys.size - 1)
            known = keys[pos] == s_corr[1:]
            after = known & (launch_ts[pos] > prev_end)
        else:
            after = np.zeros(gap.size, dtype=bool)
        short = ~after & (gap < KERNEL_WAIT_US)
        host.append(gap[after])
        kernel.append(gap[short])
        other.append(gap[~after & ~short])

    def total(parts: list[np.ndarray]) -> float:
        """Summed in the order a loop over streams and gaps would (cumsum is sequential), so the figures
        stay the same to the last digit."""
        values = np.concatenate(parts) if parts else np.zeros(0)
        return float(np.cumsum(np.concatenate([[0.0], values]))[-1])

    return total(host), total(kernel), total(other)


__all__ = ["MEMORY_KERNEL", "Temporal", "temporal"]
