"""Derived figures of a RunProfile: throughput, where step time goes, padding, utilization, MFU.

Pure functions of the profile. Every rule and every report reads these, so a number is computed once
and means the same thing everywhere.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from pitstop.hardware import GpuSpec, compute_dtype, lookup_gpu
from pitstop.plan.flops import FlopsPerToken, expected_tokens_per_s, flops_per_token, mfu
from pitstop.profile import RankProfile, RunProfile


@dataclass
class RankMetrics:
    rank: int
    steps: int
    step_time_s: float | None
    data_wait_frac: float | None
    compute_s: float | None
    tokens_per_s: float | None
    real_tokens_per_s: float | None
    gpu_util: float | None


@dataclass
class Metrics:
    steps_measured: int
    step_time_s: float | None
    step_time_p10_s: float | None
    step_time_p90_s: float | None
    samples_per_s: float | None
    tokens_per_s: float | None
    real_tokens_per_s: float | None
    data_wait_frac: float | None
    forward_frac: float | None
    backward_frac: float | None
    optimizer_frac: float | None
    other_frac: float | None
    padding_frac: float | None
    tokens_per_micro_batch: float | None
    seq_len: float | None
    mean_example_len: float | None
    gpu_util: float | None
    gpu_mem_used_frac: float | None
    pcie_rx_gbps: float | None
    pcie_tx_gbps: float | None
    syncs_per_step: float | None
    sync_frac: float | None
    main_cpu_pct: float | None
    workers_cpu_pct: float | None
    flops_per_token: float | None
    flops_basis: str | None
    compute_dtype: str | None
    gpu: str | None
    mfu: float | None
    expected_tokens_per_s: tuple[float, float] | None
    expected_basis: str | None
    hf_flops_per_s: float | None = None  # the Trainer's own 6·N·tokens count over training time
    eval_frac: float | None = None  # share of the Trainer's runtime spent in evaluation
    source_of_util: str | None = None  # "nvml", "nvidia-smi" or "trace"
    scaling_efficiency: float | None = (
        None  # multi-rank: tokens/s over world size × one rank's (see ranks.py)
    )

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or not den:
        return None
    return num / den


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _window_gpu_samples(rank: RankProfile) -> list:
    """NVML samples that fall inside the measured window (all of them when the window is unknown)."""
    if rank.window_start_t is None or rank.window_end_t is None:
        return rank.gpu_samples
    return [s for s in rank.gpu_samples if rank.window_start_t <= s.t <= rank.window_end_t]


def rank_metrics(rank: RankProfile) -> RankMetrics:
    wall = rank.wall_s
    tokens = rank.total("tokens")
    real = rank.total("real_tokens")
    utils = [s.util for s in _window_gpu_samples(rank) if s.util is not None]
    compute_parts = [rank.total(n) for n in ("forward_s", "backward_s", "optimizer_s")]
    compute = (
        None if any(p is None for p in compute_parts) else sum(p for p in compute_parts if p is not None)
    )
    return RankMetrics(
        rank=rank.rank,
        steps=len(rank.steps),
        step_time_s=rank.median_step_s,
        data_wait_frac=_ratio(rank.total("data_wait_s"), wall),
        compute_s=None if compute is None or not rank.steps else compute / len(rank.steps),
        tokens_per_s=_ratio(tokens, wall),
        real_tokens_per_s=_ratio(real, wall),
        gpu_util=statistics.fmean(utils) / 100.0 if utils else (rank.trace.gpu_util if rank.trace else None),
    )


def context_length(profile: RunProfile) -> float | None:
    """Mean length of the context a token attends over: real tokens per example."""
    real = [r.total("real_tokens") for r in profile.ranks]
    samples = [r.total("examples") for r in profile.ranks]
    if any(v is None for v in real + samples):
        return None
    total_samples = sum(s for s in samples if s is not None)
    return _ratio(sum(r for r in real if r is not None), total_samples)


def model_flops(profile: RunProfile) -> FlopsPerToken | None:
    return flops_per_token(profile.environment.model, context_length(profile))


def best_dtype(gpu: GpuSpec) -> str:
    """The fastest dtype this GPU trains in (what it *should* be doing)."""
    for dtype in ("bf16", "fp16", "tf32", "fp32"):
        if gpu.peak_flops(dtype) is not None:
            return dtype
    return "fp32"


def compute_metrics(profile: RunProfile) -> Metrics:
    ranks = [r for r in profile.ranks if r.steps]
    env = profile.environment

    def fsum(name: str) -> float | None:
        values = [r.total(name) for r in ranks]
        if not values or any(v is None for v in values):
            return None
        return float(sum(v for v in values if v is not None))

    wall_total = sum(r.wall_s for r in ranks)
    # the slowest rank paces the job
    slowest = max(ranks, key=lambda r: r.wall_s) if ranks else None
    step_walls = [s.wall_s for s in slowest.steps] if slowest else []

    def per_s(name: str) -> float | None:
        rates = [_ratio(r.total(name), r.wall_s) for r in ranks]
        if not rates or any(v is None for v in rates):
            return None
        return float(sum(v for v in rates if v is not None))

    tokens = fsum("tokens")
    real_tokens = fsum("real_tokens")
    micro_batches = fsum("micro_batches")
    syncs = fsum("syncs")
    n_steps = sum(len(r.steps) for r in ranks)

    seq_lens = [float(s.seq_len) for r in ranks for s in r.steps if s.seq_len]

    gpu_samples = [s for r in profile.ranks for s in _window_gpu_samples(r)]
    utils = [s.util for s in gpu_samples if s.util is not None]
    mem_fracs = [s.mem_used / s.mem_total for s in gpu_samples if s.mem_used is not None and s.mem_total]
    rx = [s.pcie_rx for s in gpu_samples if s.pcie_rx is not None]
    tx = [s.pcie_tx for s in gpu_samples if s.pcie_tx is not None]
    host = [h for r in ranks for h in r.host_samples]

    trace_utils = [
        r.trace.gpu_util for r in profile.ranks if r.trace is not None and r.trace.gpu_util is not None
    ]
    gpu = lookup_gpu(env.gpu_name) if env.on_gpu else None
    dtype = compute_dtype(env.param_dtype, env.autocast_dtype, env.tf32)
    fpt = model_flops(profile)
    real_tps = per_s("real_tokens")
    totals = profile.totals
    train_s = None
    if totals is not None and totals.train_s:
        train_s = (
            totals.train_s - (totals.eval_s or 0.0)
            if (totals.eval_s or 0.0) < totals.train_s
            else totals.train_s
        )
    if real_tps is None and totals is not None and totals.tokens and train_s:
        real_tps = totals.tokens / train_s  # tokens the Trainer counted, over its training time
    n_gpus = len(ranks) if ranks else (totals.n_gpus if totals and totals.n_gpus else (env.world_size or 1))
    achieved_mfu = None
    expected = None
    expected_basis = None
    mfu_dtype = dtype
    if gpu is not None and mfu_dtype is None and totals is not None:
        mfu_dtype = best_dtype(
            gpu
        )  # Trainer outputs do not say; compared with the fastest dtype, and said so
        dtype = f"{mfu_dtype} (assumed)"
    if gpu is not None and fpt is not None:
        if mfu_dtype and real_tps:
            achieved_mfu = mfu(real_tps, fpt, gpu, mfu_dtype, n_gpus)
        target = best_dtype(gpu)
        expected = expected_tokens_per_s(fpt, gpu, target, n_gpus)
        expected_basis = (
            f"{n_gpus}× {gpu.key} at 40–50% MFU in {target} "
            f"({gpu.peak_tflops[target]:.0f} TFLOP/s dense peak; {gpu.source})"
        )

    util = (
        statistics.fmean(utils) / 100.0 if utils else (statistics.fmean(trace_utils) if trace_utils else None)
    )
    util_source = None
    if utils:
        util_source = "nvidia-smi" if profile.source in ("analyze", "check") else "nvml"
    elif trace_utils:
        util_source = "trace"
    hf_flops = None
    if totals is not None and totals.hf_total_flos and train_s:
        hf_flops = totals.hf_total_flos / train_s
        peak = gpu.peak_flops(mfu_dtype) if gpu is not None and mfu_dtype else None
        if achieved_mfu is None and peak:
            achieved_mfu = hf_flops / (peak * n_gpus)  # the Trainer's own FLOP count (6·N·tokens)
    eval_frac = None
    if totals is not None and totals.eval_s is not None and totals.train_s:
        eval_frac = min(totals.eval_s / totals.train_s, 1.0)
    return Metrics(
        steps_measured=min((len(r.steps) for r in ranks), default=0),
        step_time_s=statistics.median(step_walls) if step_walls else None,
        step_time_p10_s=_percentile(step_walls, 0.1),
        step_time_p90_s=_percentile(step_walls, 0.9),
        samples_per_s=per_s("samples") if ranks else (totals.samples_per_s if totals else None),
        tokens_per_s=per_s("tokens"),
        real_tokens_per_s=real_tps,
        data_wait_frac=_ratio(fsum("data_wait_s"), wall_total),
        forward_frac=_ratio(fsum("forward_s"), wall_total),
        backward_frac=_ratio(fsum("backward_s"), wall_total),
        optimizer_frac=_ratio(fsum("optimizer_s"), wall_total),
        other_frac=_other_frac(ranks, wall_total),
        padding_frac=None
        if tokens is None or real_tokens is None or not tokens
        else 1.0 - real_tokens / tokens,
        tokens_per_micro_batch=_ratio(tokens, micro_batches),
        seq_len=_mean(seq_lens),
        mean_example_len=_ratio(real_tokens, fsum("examples")),
        gpu_util=util,
        gpu_mem_used_frac=max(mem_fracs) if mem_fracs else None,
        pcie_rx_gbps=None if not rx else statistics.fmean(rx) / 1e9,
        pcie_tx_gbps=None if not tx else statistics.fmean(tx) / 1e9,
        syncs_per_step=_ratio(syncs, n_steps),
        sync_frac=_ratio(fsum("sync_s"), wall_total),
        main_cpu_pct=_mean([h.main_cpu_pct for h in host]),
        workers_cpu_pct=_mean([h.workers_cpu_pct for h in host]),
        flops_per_token=None if fpt is None else fpt.total,
        flops_basis=None if fpt is None else fpt.basis,
        compute_dtype=dtype,
        gpu=None if gpu is None else gpu.key,
        mfu=achieved_mfu,
        expected_tokens_per_s=expected,
        expected_basis=expected_basis,
        hf_flops_per_s=hf_flops,
        eval_frac=eval_frac,
        source_of_util=util_source,
    )


def _other_frac(ranks: list[RankProfile], wall_total: float) -> float | None:
    others = [s.other_s for r in ranks for s in r.steps]
    if not others or any(o is None for o in others):
        return None
    return _ratio(sum(o for o in others if o is not None), wall_total)
