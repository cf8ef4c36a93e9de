"""Derived figures of a RunProfile: throughput, where step time goes, padding, utilization, MFU.

Pure functions of the profile. Every rule and every report reads these, so a number is computed once
and means the same thing everywhere.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from pitstop.core.profile import RankProfile, RunProfile, RunTotals
from pitstop.core.vocabulary import Source
from pitstop.diagnose.activity import recorded_by_dcgm
from pitstop.diagnose.energy import energy_of
from pitstop.diagnose.gpu_windows import GpuWindow, active_frac, active_util, gpu_windows, window_samples
from pitstop.hardware import GpuSpec, compute_dtype, lookup_gpu
from pitstop.plan.flops import FlopsPerToken, expected_tokens_per_s, flops_per_token, mfu
from pitstop.plan.rate import MfuBand, expected_mfu

CHUNKS = 5  # a window's steps are cut into this many runs of steps to estimate its throughput's spread


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
    source_of_util: str | None = None  # "nvml", "nvidia-smi", "dcgm" or "trace"
    # per GPU, inside the job's active time (diagnose/gpu_windows.py); gpu_util above stays the plain mean
    gpu_util_active: float | None = None  # mean over the GPUs that worked of their busy share while computing
    gpu_active_frac: float | None = None  # share of the sampled time in which those GPUs computed
    gpus_never_busy: int | None = None  # GPUs in the samples that never did any work (idle_gpu's)
    throughput_spread: float | None = None  # relative standard error of real tokens/s (CHUNKS runs of steps)
    scaling_efficiency: float | None = (
        None  # multi-rank: tokens/s over world size × one rank's (see ranks.py)
    )
    gpu_power_w: float | None = None  # all GPUs together, mean over the sampled time (diagnose/energy.py)
    energy_basis: str | None = None  # "energy counter", or "power × time (estimate)"
    joules_per_step: float | None = None
    joules_per_real_token: float | None = None
    # what one optimizer step holds, so a rate per step reads in its unit (a "slow" it/s may be a bigger step):
    # micro-batches per step on one rank (the mean over ranks), samples and tokens per step of the measured
    # ranks together (each rank's mean per step, summed)
    micro_batches_per_step: float | None = None
    samples_per_step: float | None = None
    tokens_per_step: float | None = None
    real_tokens_per_step: float | None = None
    # share of step time spent generating rollouts (an online RL trainer's Phase.GENERATE); None: not watched
    generate_frac: float | None = None
    # plan/rate.py's clause for the expected range: GPU generation, setup, the MFU range, what it was fitted on
    expected_rate_basis: str | None = None

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


def rank_metrics(rank: RankProfile) -> RankMetrics:
    wall = rank.wall_s
    tokens = rank.total("tokens")
    real = rank.total("real_tokens")
    utils = [s.util for s in window_samples(rank) if s.util is not None]
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
    """Length of the context the average token attends over: E[L²] / E[L] over examples when the probe
    counted Σ L² (``StepRecord.attended``), else real tokens per example (exact for equal lengths)."""
    real = [r.total("real_tokens") for r in profile.ranks]
    attended = [r.total("attended") for r in profile.ranks]
    if real and not any(v is None for v in real + attended):
        return _ratio(sum(a for a in attended if a is not None), sum(r for r in real if r is not None))
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


def _trainer_train_s(totals: RunTotals | None) -> float | None:
    """The Trainer's training time without its evaluation (train_runtime includes it)."""
    if totals is None or not totals.train_s:
        return None
    eval_s = totals.eval_s or 0.0
    return totals.train_s - eval_s if eval_s < totals.train_s else totals.train_s


@dataclass
class _Flops:
    """What the FLOPs model and the GPU's peak say: MFU, expected rate and the dtype they assume."""

    dtype: str | None
    mfu: float | None = None
    expected: tuple[float, float] | None = None
    basis: str | None = None
    rate_basis: str | None = None
    hf_flops_per_s: float | None = None


def _expected_band(profile: RunProfile, gpu: GpuSpec, fpt: FlopsPerToken, dtype: str) -> MfuBand:
    """The MFU range this run's GPU and setup should reach (``plan/rate.py``), from what the profile says."""
    env = profile.environment
    model = env.model
    method = "full"
    if (
        model.params_trainable is not None
        and model.params_total
        and model.params_trainable < model.params_total / 2
    ):
        method = "qlora" if env.quantized_base is not None and (env.quantized_base.bits or 4) <= 4 else "lora"
    offload = env.offload or {}
    where = "param" if offload.get("param") not in (None, "none") else "optimizer" if offload else "none"
    if where == "optimizer" and offload.get("optimizer") in (None, "none"):
        where = "none"
    tokens = None
    if env.micro_batch_size and env.max_seq_len:
        tokens = float(env.micro_batch_size * env.max_seq_len)
    return expected_mfu(
        gpu,
        method=method,
        compile=bool(env.torch_compile),
        ac="full" if env.gradient_checkpointing else "none",
        offload=where,
        fpt=fpt,
        model=model,
        tokens_per_micro_batch=tokens,
        dtype=dtype,
    )


def _flops_figures(profile: RunProfile, real_tps: float | None, n_gpus: int, train_s: float | None) -> _Flops:
    env, totals = profile.environment, profile.totals
    gpu = lookup_gpu(env.gpu_name) if env.on_gpu else None
    dtype = compute_dtype(env.param_dtype, env.autocast_dtype, env.tf32)
    out = _Flops(dtype)
    mfu_dtype = dtype
    if gpu is not None and mfu_dtype is None and totals is not None:
        mfu_dtype = best_dtype(
            gpu
        )  # Trainer outputs do not say; compared with the fastest dtype, and said so
        out.dtype = f"{mfu_dtype} (assumed)"
    fpt = model_flops(profile)
    if gpu is not None and fpt is not None:
        if mfu_dtype and real_tps:
            out.mfu = mfu(real_tps, fpt, gpu, mfu_dtype, n_gpus)
        target = best_dtype(gpu)
        band = _expected_band(profile, gpu, fpt, target)
        out.expected = expected_tokens_per_s(fpt, gpu, target, n_gpus, (band.low, band.high))
        out.rate_basis = band.basis
        out.basis = (
            f"{n_gpus}× {gpu.key} in {target}, {band.basis} "
            f"({gpu.peak_tflops[target]:.0f} TFLOP/s dense peak; {gpu.source})"
        )
    if totals is not None and totals.hf_total_flos and train_s:
        out.hf_flops_per_s = totals.hf_total_flos / train_s
        peak = gpu.peak_flops(mfu_dtype) if gpu is not None and mfu_dtype else None
        if out.mfu is None and peak:
            out.mfu = out.hf_flops_per_s / (peak * n_gpus)  # the Trainer's own FLOP count (6·N·tokens)
    return out


@dataclass
class _Utilization:
    util: float | None
    source: str | None
    mem_used_frac: float | None
    pcie_rx_gbps: float | None
    pcie_tx_gbps: float | None


SAMPLED = (
    "nvml",
    "nvidia-smi",
    "dcgm",
)  # utilization sources that are samples over time (not a trace's union)


def _utilization(profile: RunProfile) -> _Utilization:
    """GPU busy share and memory over the samples inside each rank's window (the trace's share without)."""
    samples = [s for r in profile.ranks for s in window_samples(r)]
    utils = [s.util for s in samples if s.util is not None]
    mem_fracs = [s.mem_used / s.mem_total for s in samples if s.mem_used is not None and s.mem_total]
    rx = [s.pcie_rx for s in samples if s.pcie_rx is not None]
    tx = [s.pcie_tx for s in samples if s.pcie_tx is not None]
    traced = [r.trace.gpu_util for r in profile.ranks if r.trace is not None and r.trace.gpu_util is not None]
    util, source = None, None
    if utils:
        util = statistics.fmean(utils) / 100.0
        source = "nvidia-smi" if profile.source in (Source.ANALYZE, Source.CHECK) else "nvml"
        if source == "nvidia-smi" and any(r.gpu_samples and recorded_by_dcgm(r) for r in profile.ranks):
            source = "dcgm"
    elif traced:
        util, source = statistics.fmean(traced), "trace"
    return _Utilization(
        util=util,
        source=source,
        mem_used_frac=max(mem_fracs) if mem_fracs else None,
        pcie_rx_gbps=None if not rx else statistics.fmean(rx) / 1e9,
        pcie_tx_gbps=None if not tx else statistics.fmean(tx) / 1e9,
    )


def throughput_spread(profile: RunProfile) -> float | None:
    """Relative standard error of the real tokens/s, from the rates of ``CHUNKS`` consecutive runs of
    steps of the slowest rank (how far a second window of the same job may land)."""
    ranks = [r for r in profile.ranks if r.steps]
    if not ranks or any(s.real_tokens is None for r in ranks for s in r.steps):
        return None
    steps = max(ranks, key=lambda r: r.wall_s).steps
    n = min(CHUNKS, len(steps))
    if n < 2:
        return None
    size = len(steps) / n
    rates = []
    for i in range(n):
        chunk = steps[round(i * size) : round((i + 1) * size)]
        rates.append(sum(s.real_tokens or 0 for s in chunk) / sum(s.wall_s for s in chunk))
    mean = statistics.fmean(rates)
    return statistics.stdev(rates) / mean / n**0.5 if mean else None


class _Sums:
    """Sums over the ranks that measured steps (None when any rank lacks the field)."""

    def __init__(self, ranks: list[RankProfile]) -> None:
        self.ranks = ranks
        self.wall = sum(r.wall_s for r in ranks)

    def total(self, name: str) -> float | None:
        values = [r.total(name) for r in self.ranks]
        if not values or any(v is None for v in values):
            return None
        return float(sum(v for v in values if v is not None))

    def per_s(self, name: str) -> float | None:
        """Summed over ranks of each rank's own rate: the job's rate."""
        rates = [_ratio(r.total(name), r.wall_s) for r in self.ranks]
        if not rates or any(v is None for v in rates):
            return None
        return float(sum(v for v in rates if v is not None))

    def frac(self, name: str) -> float | None:
        return _ratio(self.total(name), self.wall)

    def per_step_summed(self, name: str) -> float | None:
        """Each rank's mean per step, summed over ranks: what one step of the job holds."""
        mean = self.per_step(name)
        return None if mean is None else mean * len(self.ranks)

    def per_step(self, name: str) -> float | None:
        """The mean over ranks of each rank's mean per step: a rank that measured more steps (traces of
        different lengths) weighs no more than another."""
        means = [_ratio(r.total(name), len(r.steps)) for r in self.ranks]
        if not means or any(v is None for v in means):
            return None
        return statistics.fmean(v for v in means if v is not None)


def compute_metrics(profile: RunProfile, gpus: list[GpuWindow] | None = None) -> Metrics:
    """Every headline figure of the run; ``gpus`` are its GPU windows when already computed."""
    ranks = [r for r in profile.ranks if r.steps]
    env, totals = profile.environment, profile.totals
    sums = _Sums(ranks)
    slowest = max(ranks, key=lambda r: r.wall_s) if ranks else None  # the slowest rank paces the job
    step_walls = [s.wall_s for s in slowest.steps] if slowest else []
    tokens, real_tokens = sums.total("tokens"), sums.total("real_tokens")
    host = [h for r in ranks for h in r.host_samples]
    train_s = _trainer_train_s(totals)
    real_tps = sums.per_s("real_tokens")
    if real_tps is None and totals is not None and totals.tokens and train_s:
        real_tps = totals.tokens / train_s  # tokens the Trainer counted, over its training time
    n_gpus = (
        sum(r.gpus_held for r in ranks)
        if ranks
        else (totals.n_gpus if totals and totals.n_gpus else (env.world_size or 1))
    )
    flops = _flops_figures(profile, real_tps, n_gpus, train_s)
    fpt = model_flops(profile)
    use = _utilization(profile)
    windows = gpu_windows(profile) if gpus is None else gpus
    gpu = lookup_gpu(env.gpu_name) if env.on_gpu else None
    seq_lens = [float(s.seq_len) for r in ranks for s in r.steps if s.seq_len]
    trainer_step_s = _ratio(train_s, totals.steps if totals else None)
    step_s = statistics.median(step_walls) if step_walls else trainer_step_s
    energy = energy_of(profile, step_s, real_tps)
    return Metrics(
        steps_measured=min((len(r.steps) for r in ranks), default=0),
        step_time_s=statistics.median(step_walls) if step_walls else None,
        step_time_p10_s=_percentile(step_walls, 0.1),
        step_time_p90_s=_percentile(step_walls, 0.9),
        samples_per_s=sums.per_s("samples") if ranks else (totals.samples_per_s if totals else None),
        tokens_per_s=sums.per_s("tokens"),
        real_tokens_per_s=real_tps,
        data_wait_frac=sums.frac("data_wait_s"),
        forward_frac=sums.frac("forward_s"),
        backward_frac=sums.frac("backward_s"),
        optimizer_frac=sums.frac("optimizer_s"),
        other_frac=_other_frac(ranks, sums.wall),
        padding_frac=None if tokens is None or real_tokens is None else _padding(tokens, real_tokens),
        tokens_per_micro_batch=_ratio(tokens, sums.total("micro_batches")),
        seq_len=_mean(seq_lens),
        mean_example_len=_ratio(real_tokens, sums.total("examples")),
        gpu_util=use.util,
        gpu_mem_used_frac=use.mem_used_frac,
        pcie_rx_gbps=use.pcie_rx_gbps,
        pcie_tx_gbps=use.pcie_tx_gbps,
        syncs_per_step=sums.per_step("syncs"),
        sync_frac=_ratio(sums.per_step("sync_s"), sums.per_step("wall_s")),
        main_cpu_pct=_mean([h.main_cpu_pct for h in host]),
        workers_cpu_pct=_mean([h.workers_cpu_pct for h in host]),
        flops_per_token=None if fpt is None else fpt.total,
        flops_basis=None if fpt is None else fpt.basis,
        compute_dtype=flops.dtype,
        gpu=None if gpu is None else gpu.key,
        mfu=flops.mfu,
        expected_tokens_per_s=flops.expected,
        expected_basis=flops.basis,
        expected_rate_basis=flops.rate_basis,
        hf_flops_per_s=flops.hf_flops_per_s,
        eval_frac=None
        if totals is None or totals.eval_s is None or not totals.train_s
        else min(totals.eval_s / totals.train_s, 1.0),
        source_of_util=use.source,
        gpu_util_active=active_util(windows) if use.source in SAMPLED else None,
        gpu_active_frac=active_frac(windows) if use.source in SAMPLED else None,
        gpus_never_busy=sum(w.never_busy for w in windows) if windows else None,
        throughput_spread=throughput_spread(profile),
        gpu_power_w=None if energy is None else energy.power_w,
        energy_basis=None if energy is None else energy.basis,
        joules_per_step=None if energy is None else energy.joules_per_step,
        joules_per_real_token=None if energy is None else energy.joules_per_real_token,
        micro_batches_per_step=sums.per_step("micro_batches") or None,  # 0: a source that does not count them
        samples_per_step=sums.per_step_summed("samples"),
        tokens_per_step=sums.per_step_summed("tokens"),
        real_tokens_per_step=sums.per_step_summed("real_tokens"),
        generate_frac=sums.frac("generate_s"),
    )


def _padding(tokens: float, real_tokens: float) -> float | None:
    return 1.0 - real_tokens / tokens if tokens else None


def _other_frac(ranks: list[RankProfile], wall_total: float) -> float | None:
    others = [s.other_s for r in ranks for s in r.steps]
    if not others or any(o is None for o in others):
        return None
    return _ratio(sum(o for o in others if o is not None), wall_total)
