"""What neither the TensorBoard plugin nor HTA reports, per step: host syncs, pageable copies, tiny
kernels, fp32 GEMMs, the attention path that ran, NCCL time and how much of it hides behind compute, and
the DataLoader's share."""

from __future__ import annotations

import numpy as np

from pitstop.core.profile import StepCategories, TraceStats, from_jsonable
from pitstop.trace.events import COMMUNICATION, COMPUTE, H2D_PAGEABLE, H2D_PINNED, TraceColumns
from pitstop.trace.intervals import intersection_length, length, union
from pitstop.trace.overview import Overview

TINY_KERNEL_US = 10.0


def _per_step(
    values_ts: np.ndarray, lo: np.ndarray, hi: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """How many of the timestamps fall into each step window (with ``weights``: the sum of theirs)."""
    idx = np.searchsorted(lo, values_ts, side="right") - 1
    ok = (idx >= 0) & (values_ts < hi[np.clip(idx, 0, None)])
    return np.bincount(idx[ok], weights=None if weights is None else weights[ok], minlength=lo.size)


def attention_path(cols: TraceColumns) -> str | None:
    if cols.attention_ops:
        return cols.attention_ops.most_common(1)[0][0]
    if cols.softmax_ops and cols.bmm_ops:
        return "eager"  # softmax between batched matmuls: the unfused path
    return None


def step_syncs(cols: TraceColumns, view: Overview) -> tuple[list[int], list[float]]:
    """Each step's host syncs and the seconds the host spent blocked in them (what the live probe counts
    into ``StepRecord.syncs`` and ``sync_s``): the blocking runtime calls (stream, device and event
    synchronizations) or the ``.item()`` / ``.tolist()`` reads (aten::_local_scalar_dense), whichever the
    step has more of (a read blocks in a runtime call of its own only on some devices), and the time inside
    those runtime calls. A call counts for the step it starts in; one outside every step counts for none."""
    lo = np.array([s.start for s in view.steps])
    hi = np.array([s.end for s in view.steps])
    rt = cols.runtime
    sync_mask = np.frombuffer(rt.sync, dtype=np.int8) == 1
    rt_ts, rt_end = np.frombuffer(rt.ts, dtype=np.float64), np.frombuffer(rt.end, dtype=np.float64)
    ts = rt_ts[sync_mask]
    syncs = _per_step(ts, lo, hi)
    blocked_us = _per_step(ts, lo, hi, weights=rt_end[sync_mask] - ts)
    items = _per_step(np.frombuffer(cols.sync_ops.ts, dtype=np.float64), lo, hi)
    return np.maximum(syncs, items).tolist(), (blocked_us / 1e6).tolist()


def _copies(stats: TraceStats, cols: TraceColumns, lo: np.ndarray, hi: np.ndarray) -> None:
    """Host-to-device megabytes per step, pageable and pinned."""
    n = lo.size
    mc = cols.memcpy
    kinds = np.frombuffer(mc.code, dtype=np.int8)
    sizes = np.frombuffer(cols.memcpy_bytes, dtype=np.float64)
    mc_ts = np.frombuffer(mc.ts, dtype=np.float64)
    if mc_ts.size:
        steps_of = np.searchsorted(lo, mc_ts, side="right") - 1
        inside = (steps_of >= 0) & (mc_ts < hi[np.clip(steps_of, 0, None)])
        stats.h2d_pageable_mb = float(sizes[inside & (kinds == H2D_PAGEABLE)].sum()) / n / 1e6
        stats.h2d_pinned_mb = float(sizes[inside & (kinds == H2D_PINNED)].sum()) / n / 1e6


def _kernels(stats: TraceStats, cols: TraceColumns, lo: np.ndarray, hi: np.ndarray) -> bool:
    """Kernels per step, tiny kernels, launch-bound, and NCCL time and overlap; False when the trace has no
    kernels."""
    n = lo.size
    k = cols.kernels
    k_ts, k_end = np.frombuffer(k.ts, dtype=np.float64), np.frombuffer(k.end, dtype=np.float64)
    codes = np.frombuffer(k.code, dtype=np.int8)
    if k_ts.size:
        per_step = _per_step(k_ts, lo, hi)
        stats.kernels_per_step = float(per_step.mean())
        durs = k_end - k_ts
        stats.tiny_kernel_frac = float(np.mean(durs < TINY_KERNEL_US))
        mean_kernel = float(durs.mean())
        breakdown = stats.breakdown_ms or StepCategories()
        stats.launch_bound = bool(
            (stats.gpu_util or 1.0) < 0.6 and mean_kernel < 20.0 and breakdown.runtime > breakdown.kernel
        )
        comm = codes == COMMUNICATION
        if comm.any():
            comm_u = union(k_ts[comm], k_end[comm])
            comp_u = union(k_ts[codes == COMPUTE], k_end[codes == COMPUTE])
            nccl = length(*comm_u)
            stats.nccl_ms = nccl / n / 1000.0
            stats.nccl_overlap_frac = intersection_length(comm_u, comp_u) / nccl if nccl else None
        else:
            stats.nccl_ms = 0.0
    return bool(k_ts.size)


def trace_stats(cols: TraceColumns, view: Overview) -> TraceStats:
    stats = TraceStats()
    if not view.steps:
        stats.limitations.append(
            "no ProfilerStep#N spans: record with torch.profiler.profile(schedule=...) and "
            "call prof.step() every step"
        )
        return stats
    lo = np.array([s.start for s in view.steps])
    hi = np.array([s.end for s in view.steps])
    n = len(view.steps)
    # the plugin's category names are StepCategories' JSON keys
    stats.breakdown_ms = from_jsonable(
        StepCategories, {k: v / 1000.0 for k, v in view.mean_role_us().items()}
    )
    if view.gpu_util:
        stats.gpu_util = float(np.mean(list(view.gpu_util.values())))
    if cols.dataloader_names:
        stats.dataloader_multiprocess = any("MultiProcessing" in name for name in cols.dataloader_names)

    _copies(stats, cols, lo, hi)
    has_kernels = _kernels(stats, cols, lo, hi)
    if cols.gemm_us:
        stats.gemm_ms = cols.gemm_us / n / 1000.0
        stats.fp32_gemm_frac = cols.gemm_fp32_us / cols.gemm_us
        stats.tf32_gemm_frac = cols.gemm_tf32_us / cols.gemm_us
        stats.low_precision_gemm_frac = cols.gemm_low_us / cols.gemm_us
    elif cols.matmul_dtypes:
        total = sum(cols.matmul_dtypes.values())
        stats.fp32_gemm_frac = cols.matmul_dtypes.get("float", 0) / total
    stats.attention_path = attention_path(cols)
    if cols.negative_durations:
        stats.limitations.append(f"{cols.negative_durations} events with negative durations were skipped")
    if cols.bad_events:
        stats.limitations.append(f"{cols.bad_events} events without a usable timestamp were skipped")
    if not has_kernels:
        stats.limitations.append(
            "no GPU kernels in the trace: a CPU-only run, or recorded without CUDA activity"
        )
    return stats
