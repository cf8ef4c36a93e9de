"""PyTorch profiler (Kineto) traces into RankProfiles: per-step records plus TraceStats."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pitstop.core.profile import Environment, GpuTime, IdleSplit, RankProfile, StepRecord, assemble_rank
from pitstop.core.vocabulary import Device
from pitstop.trace.batch import batch_of
from pitstop.trace.events import TraceColumns, read_columns
from pitstop.trace.overview import Overview, overview
from pitstop.trace.stats import step_syncs, trace_stats
from pitstop.trace.temporal import temporal


def _environment(cols: TraceColumns) -> Environment:
    env = Environment(framework=None, world_size=cols.world_size)
    devices = np.frombuffer(cols.kernels.device, dtype=np.int64)
    used = sorted(set(devices.tolist()) - {-1})
    if used or cols.vendor:
        env.device = Device.CUDA
        name = cols.device_names.get(used[0]) if used else next(iter(cols.device_names.values()), None)
        env.gpu_name = name
        env.gpu_count = len(cols.device_names) or None
    else:
        env.device = Device.CPU
    if cols.matmul_dtypes:
        top = cols.matmul_dtypes.most_common(1)[0][0]
        env.param_dtype = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16"}.get(top)
    if cols.gemm_us:  # what the GEMM kernels ran in says more than operator input types
        shares = {"bf16": cols.gemm_low_us, "tf32": cols.gemm_tf32_us, "fp32": cols.gemm_fp32_us}
        kind, time = max(shares.items(), key=lambda kv: kv[1])
        if time >= 0.5 * cols.gemm_us:
            if kind == "bf16":
                env.autocast_dtype = env.autocast_dtype or "bf16"
            else:
                env.param_dtype = "fp32"
                env.tf32 = kind == "tf32"
    return env


def _steps(view: Overview, cols: TraceColumns) -> list[StepRecord]:
    """The ProfilerStep spans as the StepRecords a live run fills: wall time, data wait (the DataLoader's
    share of the step), batches fetched, host syncs and the time blocked in them."""
    records = []
    dl = np.frombuffer(cols.dataloader.ts, dtype=np.float64)
    syncs, sync_s = step_syncs(cols, view) if view.steps else ([], [])
    for i, (step, roles) in enumerate(zip(view.steps, view.role_us, strict=True)):
        records.append(
            StepRecord(
                index=step.number,
                wall_s=step.duration / 1e6,
                data_wait_s=roles["DataLoader"] / 1e6,
                micro_batches=int(np.sum((dl >= step.start) & (dl < step.end))) or 0,
                syncs=int(syncs[i]),
                sync_s=float(sync_s[i]),
            )
        )
    return records


def load_trace(path: Path, fallback_rank: int = 0) -> RankProfile:
    return profile_of(read_columns(path), fallback_rank)[0]


def profile_of(cols: TraceColumns, fallback_rank: int = 0) -> tuple[RankProfile, Overview]:
    """The RankProfile of one trace's columns, and the step view it was computed from."""
    view = overview(cols)
    stats = trace_stats(cols, view)
    stats.batch = batch_of(cols, view)
    hta = temporal(cols)
    if hta is not None:
        stats.temporal = GpuTime(**{k: round(v, 4) for k, v in hta.shares().items()})
        stats.idle_split = IdleSplit(**{k: round(float(v), 4) for k, v in hta.idle_split().items()})
        if view.steps:
            stats.host_wait_ms = hta.host_wait_us / len(view.steps) / 1000.0
    env = _environment(cols)
    rank = assemble_rank(cols.rank if cols.rank is not None else fallback_rank, env, steps=_steps(view, cols))
    rank.trace = stats
    if not view.aligned and view.steps and len(cols.kernels):
        stats.limitations.append("steps could not be aligned to the GPU (no runtime call matched a kernel)")
    return rank, view
