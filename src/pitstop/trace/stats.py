"""What neither the TensorBoard plugin nor HTA reports, per step: host syncs, pageable copies, tiny
kernels, fp32 GEMMs, the attention path that ran, NCCL time and how much of it hides behind compute, the
DataLoader's share, the runtime calls the host spent its time in (and what the GPU did meanwhile), how busy
the GPU was, and whether the trace is of training or of inference."""

from __future__ import annotations

import numpy as np

from pitstop.core.profile import RuntimeCall, StepCategories, TraceStats, from_jsonable
from pitstop.core.vocabulary import RuntimeApi, Workload
from pitstop.trace.events import (
    ALLOC_RUNTIME,
    COMMUNICATION,
    COMPUTE,
    D2H,
    H2D_PAGEABLE,
    H2D_PINNED,
    LAUNCH_NAMES,
    SYNC_RUNTIME,
    TraceColumns,
)
from pitstop.trace.intervals import intersection_length, length, union
from pitstop.trace.overview import Overview

TINY_KERNEL_US = 10.0
RUNTIME_CALLS_KEPT = 5  # the runtime calls a trace's statistics list, by time
RUNTIME_CALL_MIN_FRAC = 0.01  # and only those above this share of the step


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
    rt_ts, rt_end = np.frombuffer(rt.ts, dtype=np.float64), np.frombuffer(rt.end, dtype=np.float64)
    sync_mask = np.frombuffer(rt.sync, dtype=np.int8) == 1
    copies = blocking_copies(cols)
    calls = sync_mask & ~copies  # a read is a blocking copy and its synchronize: counted once
    syncs = _per_step(rt_ts[calls], lo, hi)
    copied = _per_step(rt_ts[copies], lo, hi)
    blocking = sync_mask | copies
    ts = rt_ts[blocking]
    blocked_us = _per_step(ts, lo, hi, weights=rt_end[blocking] - ts)
    items = _per_step(np.frombuffer(cols.sync_ops.ts, dtype=np.float64), lo, hi)
    return np.maximum(np.maximum(syncs, copied), items).tolist(), (blocked_us / 1e6).tolist()


def _memcpy_calls(cols: TraceColumns) -> np.ndarray:
    """Which runtime calls are copies (cudaMemcpy*, hipMemcpy*), from their names."""
    codes = np.frombuffer(cols.runtime.api, dtype=np.int8)
    copy_codes = [i + 1 for i, name in enumerate(cols.runtime_names) if "Memcpy" in name]
    return np.isin(codes, copy_codes) if copy_codes else np.zeros(codes.size, dtype=bool)


def blocking_copies(cols: TraceColumns) -> np.ndarray:
    """Runtime copy calls the host waited in: the blocking ones by name (cudaMemcpy, hipMemcpyWithStream), and
    an asynchronous device-to-host copy that returned only once its copy had ended (to pageable memory it is
    synchronous: the host waits for the GPU to reach the copy and finish it, as ``.cpu()`` does)."""
    rt = cols.runtime
    by_name = (np.frombuffer(rt.sync, dtype=np.int8) == 1) & _memcpy_calls(cols)
    mc = cols.memcpy
    d2h = np.frombuffer(mc.code, dtype=np.int8) == D2H
    if not d2h.any():
        return by_name
    corr = np.frombuffer(mc.correlation, dtype=np.int64)[d2h]
    copy_end = np.frombuffer(mc.end, dtype=np.float64)[d2h]
    order = np.argsort(corr, kind="stable")
    corr, copy_end = corr[order], copy_end[order]
    rt_corr = np.frombuffer(rt.correlation, dtype=np.int64)
    pos = np.minimum(np.searchsorted(corr, rt_corr), corr.size - 1)
    matched = (corr[pos] == rt_corr) & (rt_corr >= 0) & _memcpy_calls(cols)
    waited = matched & (np.frombuffer(rt.end, dtype=np.float64) >= copy_end[pos])
    return by_name | waited


def _api_kind(name: str) -> RuntimeApi:
    if ALLOC_RUNTIME.match(name):
        return RuntimeApi.ALLOC
    if name in SYNC_RUNTIME:
        return RuntimeApi.SYNC
    if name in LAUNCH_NAMES:
        return RuntimeApi.LAUNCH
    return RuntimeApi.OTHER


def _clip(
    starts: np.ndarray, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals cut to the (disjoint, sorted) step windows."""
    out_s, out_e = [], []
    for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
        i, j = np.searchsorted(ends, a, side="right"), np.searchsorted(starts, b, side="left")
        if j > i:
            out_s.append(np.maximum(starts[i:j], a))
            out_e.append(np.minimum(ends[i:j], b))
    if not out_s:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(out_s), np.concatenate(out_e)


def gpu_busy(cols: TraceColumns, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of everything the GPU ran (kernels, copies, sets), cut to the steps."""
    parts = (cols.kernels, cols.memcpy, cols.memset)
    ts = np.concatenate([np.frombuffer(p.ts, dtype=np.float64) for p in parts])
    end = np.concatenate([np.frombuffer(p.end, dtype=np.float64) for p in parts])
    return _clip(*union(ts, end), lo, hi)


def runtime_calls(
    cols: TraceColumns, lo: np.ndarray, hi: np.ndarray, busy: tuple[np.ndarray, np.ndarray]
) -> list[RuntimeCall]:
    """The runtime calls the host spent the most time in, inside the steps: each one's share of the step
    (the union of its calls over threads) and how busy the GPU was meanwhile."""
    rt = cols.runtime
    codes = np.frombuffer(rt.api, dtype=np.int8)
    if codes.size == 0:
        return []
    rt_ts, rt_end = np.frombuffer(rt.ts, dtype=np.float64), np.frombuffer(rt.end, dtype=np.float64)
    total = float(np.sum(hi - lo))
    copies = blocking_copies(cols)
    found = []
    for code in np.unique(codes).tolist():
        if code <= 0:
            continue
        name = cols.runtime_names[code - 1]
        named = codes == code
        # a name's blocking copies apart from its others (cudaMemcpyAsync: device-to-device ones return at once)
        for mask, blocking in ((named & copies, True), (named & ~copies, False)):
            time, found_call = _runtime_call(name, blocking, mask, rt_ts, rt_end, lo, hi, busy)
            if found_call is not None and total and time / total >= RUNTIME_CALL_MIN_FRAC:
                found_call.frac_of_step = round(time / total, 4)
                found.append(found_call)
    found.sort(key=lambda c: -c.frac_of_step)
    evidence = (RuntimeApi.ALLOC, RuntimeApi.SYNC, RuntimeApi.BLOCKING_COPY)  # what rules read: always kept
    return [c for i, c in enumerate(found) if i < RUNTIME_CALLS_KEPT or c.kind in evidence]


def _runtime_call(
    name: str,
    blocking: bool,
    mask: np.ndarray,
    rt_ts: np.ndarray,
    rt_end: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    busy: tuple[np.ndarray, np.ndarray],
) -> tuple[float, RuntimeCall | None]:
    """One runtime call's time inside the steps (the union of its calls), as a RuntimeCall (share filled in by
    the caller)."""
    if not mask.any():
        return 0.0, None
    spans = _clip(*union(rt_ts[mask], rt_end[mask]), lo, hi)
    time = length(*spans)
    if not time:
        return 0.0, None
    kind = RuntimeApi.BLOCKING_COPY if blocking else _api_kind(name)
    label = f"{name} (blocking)" if blocking and kind != RuntimeApi.SYNC and "Async" in name else name
    return time, RuntimeCall(
        name=label,
        kind=kind,
        calls_per_step=round(float(_per_step(rt_ts[mask], lo, hi).sum()) / lo.size, 2),
        ms_per_step=round(time / lo.size / 1000.0, 4),
        gpu_busy_frac=round(intersection_length(spans, busy) / time, 4),
    )


def workload(cols: TraceColumns) -> Workload | None:
    """Training when the trace holds a backward pass or an optimizer's step; inference when it recorded the
    host's operators and holds neither (``inference_mode`` / ``no_grad`` evaluation); None when it recorded no
    operators of a model to tell."""
    if cols.backward_ops or len(cols.backward) or len(cols.optimizer_steps) or len(cols.zero_grads):
        return Workload.TRAINING
    # operators that ran a model: GPU work, or (a CPU trace) the host's own matrix multiplications
    if len(cols.cpu_ops) and (len(cols.kernels) or len(cols.runtime) or cols.matmul_ops):
        return Workload.INFERENCE
    return None


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
    stats = TraceStats(steps_from=view.steps_from, workload=workload(cols))
    if view.steps_from != "ProfilerStep#N spans":
        how = (
            view.steps_from
            if view.steps_from.startswith("no ProfilerStep")
            else f"no ProfilerStep#N spans, {view.steps_from}"
        )
        stats.limitations.append(
            f"{how}; record with torch.profiler.profile(schedule=...) and call prof.step() every step for exact steps"
        )
    if not view.steps:
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
    busy = gpu_busy(cols, lo, hi)
    total = float(np.sum(hi - lo))
    if busy[0].size and total:
        stats.gpu_busy_frac = round(length(*busy) / total, 4)
    stats.runtime_calls = runtime_calls(cols, lo, hi, busy)
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
