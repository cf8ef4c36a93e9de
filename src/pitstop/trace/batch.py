"""The batch of a trace's steps (``TraceBatch``): the shapes' log (shapes.py) read over the steps, with the
kernels' and copies' time per step that the batch estimate (diagnose/causes/small_batch.py) splits into
what grows with the batch and what a step pays once."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from pitstop.core.profile import TraceBatch
from pitstop.trace.events import COMPUTE, H2D_PAGEABLE, H2D_PINNED, TraceColumns
from pitstop.trace.shapes import KERNEL_FLOOR_US

if TYPE_CHECKING:
    import numpy as np

    from pitstop.trace.overview import Overview


def _in_steps(ts: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    import numpy as np

    idx = np.searchsorted(lo, ts, side="right") - 1
    return (idx >= 0) & (ts < hi[np.clip(idx, 0, None)])


def batch_of(cols: TraceColumns, view: Overview) -> TraceBatch | None:
    """The batch of the trace's steps and how their kernels would scale with it; None without steps or
    without recorded shapes."""
    import numpy as np

    log = cols.shapes
    first = log.first_layer()
    if not view.steps or first is None:
        return None
    name, weight, layer = first
    lo = np.array([s.start for s in view.steps])
    hi = np.array([s.end for s in view.steps])
    n = lo.size
    ts = np.frombuffer(layer.ts, dtype=np.float64)
    inside = _in_steps(ts, lo, hi)
    if not inside.any():
        inside = np.ones(ts.size, dtype=bool)  # steps the host did not mark around the ops: all calls
    leads = np.frombuffer(layer.lead, dtype=np.int64)[inside]
    tokens = np.frombuffer(layer.tokens, dtype=np.int64)[inside]
    counts = Counter(zip(leads.tolist(), tokens.tolist(), strict=True))
    (lead, tok), seen = counts.most_common(1)[0]
    forwards = max(1, round(int(inside.sum()) / n))
    batch = TraceBatch(
        samples=lead or None,
        tokens=tok or None,
        forwards_per_step=forwards,
        input_op=name,
        weight_dims=list(weight),
        agreeing=round(seen / len(leads), 3),
    )
    g_ts = np.frombuffer(log.gemm_ts, dtype=np.float64)
    if g_ts.size:
        flop = np.frombuffer(log.gemm_flop, dtype=np.float64)
        batch.gemm_gflop = round(float(flop[_in_steps(g_ts, lo, hi)].sum()) / n / 1e9, 4)
    _kernel_scaling(batch, cols, lo, hi)
    return batch


def _kernel_scaling(batch: TraceBatch, cols: TraceColumns, lo: np.ndarray, hi: np.ndarray) -> None:
    """Per step: the kernels' time, the part of it under each kernel's latency floor (what a larger batch
    does not lengthen), and the host-to-device copies' time (which grows with the batch)."""
    import numpy as np

    n = lo.size
    k = cols.kernels
    k_ts, k_end = np.frombuffer(k.ts, dtype=np.float64), np.frombuffer(k.end, dtype=np.float64)
    codes = np.frombuffer(k.code, dtype=np.int8)
    keep = _in_steps(k_ts, lo, hi) & (codes == COMPUTE)
    durs = (k_end - k_ts)[keep]
    batch.kernel_ms = round(float(durs.sum()) / n / 1000.0, 4)
    batch.kernel_floor_ms = round(float(np.minimum(durs, KERNEL_FLOOR_US).sum()) / n / 1000.0, 4)
    batch.floor_us = KERNEL_FLOOR_US
    batch.kernels_per_step = round(int(keep.sum()) / n, 1)
    mc = cols.memcpy
    m_ts, m_end = np.frombuffer(mc.ts, dtype=np.float64), np.frombuffer(mc.end, dtype=np.float64)
    kinds = np.frombuffer(mc.code, dtype=np.int8)
    h2d = _in_steps(m_ts, lo, hi) & ((kinds == H2D_PAGEABLE) | (kinds == H2D_PINNED))
    batch.h2d_ms = round(float((m_end - m_ts)[h2d].sum()) / n / 1000.0, 4)
