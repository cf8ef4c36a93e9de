"""Rules about how the step computes: attention path, precision, batch size, host syncs, communication, MFU."""

from __future__ import annotations

import statistics

from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.diagnose.gpu_windows import working
from pitstop.diagnose.ranks import RanksAnalysis
from pitstop.diagnose.rules.activity import Activity, read_activity
from pitstop.findings import Finding, Use, use
from pitstop.hardware import EXPECTED_MFU
from pitstop.interconnect import Link
from pitstop.plan.flops import flops_per_token
from pitstop.plan.from_run import has_shape, setup_for_run
from pitstop.plan.memory import GIB
from pitstop.plan.planner import largest_micro_batch
from pitstop.remedies import advise
from pitstop.remedies.micro_batch import next_micro_batch
from pitstop.vocabulary import CauseId, Device, RemedyId, Severity

SM_FULL = 0.8  # SM activity a well-filled GPU reaches (est. target for small_batch from the counters)
OCC_FULL = 0.5  # occupancy both counters agree below, with SM activity under SM_FULL

EAGER_SLOWDOWN = {"gpu": 3.0, "cpu": 2.0}
"""Where the job's attention was not timed after its window (``attention_timing``: traces, a probe inside the
user's script), how much slower per FLOP eager attention is taken to run than fused kernels: it writes and re-reads the S×S score
matrix (softmax, mask, dropout are memory-bound). On GPUs FlashAttention (Dao et al. 2022) reports 2–4× on
the attention itself; we take 3×. On CPUs the fused kernel gains less: pitstop's own measurement of a small
Llama (d=64, 256-token rows) gave 2.2×; we take 2×. The basis string always says which was used. Timed,
in the job, the same CPU gave 1.0× at 128-token rows and 1.6× at 384 (the calibration's eager cases)."""


def slow_attention(ctx: RuleContext) -> Finding | None:
    att = ctx.env.attention
    impl = att.implementation
    traced = [t.attention_path for t in ctx.traces if t.attention_path]
    if impl == "eager":
        confidence = 0.95 if ctx.measured else 0.8
        how = "the model's config asks for attn_implementation='eager'"
    elif impl is not None and impl.startswith("eager (nn.MultiheadAttention"):
        confidence = 0.9 if ctx.measured else 0.7
        how = (
            "torch's nn.MultiheadAttention is called with need_weights=True (no SDPA call in the measured "
            "steps), so it computes the attention weights instead of the fused kernel"
        )
    elif traced and traced[0] in ("eager", "math"):
        confidence = 0.8
        how = (
            "the trace shows softmax between batched matmuls (the unfused path)"
            if traced[0] == "eager"
            else "the trace shows SDPA falling back to its math kernel"
        )
        impl = traced[0]
    elif impl is None and att.sdpa_calls == 0 and ctx.env.model.n_heads and not traced:
        confidence = 0.5
        how = "no fused attention (SDPA) call was seen in the measured steps"
    else:
        return None
    m = ctx.metrics
    seq = m.seq_len or (float(ctx.env.max_seq_len) if ctx.env.max_seq_len else None)
    model = ctx.env.model
    fpt = flops_per_token(model, seq)
    evidence: dict[str, object] = {
        "attn_implementation": impl,
        "sdpa_calls_per_step": None
        if att.sdpa_calls is None or not m.steps_measured
        else round(att.sdpa_calls / m.steps_measured, 1),
        "row_len": round(seq, 1) if seq else None,
    }
    est = None
    basis = "attention share of FLOPs unknown (no model config)"
    timed = _timed_attention(ctx)
    if fpt is not None and fpt.total > 0 and fpt.attention > 0 and seq:
        evidence["attention_flops_frac"] = round(fpt.attention / fpt.total, 3)
    if timed is not None:
        est, basis, measured = timed
        evidence.update(measured)
    elif fpt is not None and fpt.total > 0 and fpt.attention > 0 and seq:
        share = fpt.attention / fpt.total
        c = ctx.compute_frac
        k = EAGER_SLOWDOWN["gpu" if ctx.gpu_possible and ctx.env.device != Device.CPU else "cpu"]
        # compute time with eager attention ∝ (1 − a) + k·a; with fused kernels ∝ 1
        est = amdahl(c, (1 - share) + k * share)
        basis = (
            f"attention is {share:.1%} of the FLOPs at row length {seq:.0f} (12·L·d·T of "
            f"6N + 12·L·d·T); eager attention taken as {k:.0f}× slower per FLOP than fused kernels on a "
            f"{'CPU' if ctx.env.device == Device.CPU else 'GPU'}; compute is {c:.0%} of the step"
        )
    severity = Severity.MEDIUM
    if timed is not None and est is not None:
        # timed where the job runs: graded by the share of the step it saves, as a loader's wait is
        severity = severity_for(1 - 1 / est, 0.20, 0.10)
    else:
        if seq is not None:
            severity = severity_for(seq, 1024, 256)
        if est is not None and est >= 1.25:
            severity = Severity.HIGH
    summary = f"Attention runs the eager (unfused) path: {how}."
    if seq:
        summary += f" Rows are {seq:.0f} tokens long, so each layer writes a {int(seq)}×{int(seq)} score matrix per head."
    return Finding(
        cause=CauseId.SLOW_ATTENTION,
        severity=severity,
        confidence=confidence,
        summary=summary,
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=advise(ctx.framework, use(RemedyId.ATTENTION, **attention_target(ctx))),
    )


def _timed_attention(ctx: RuleContext) -> tuple[float, str, dict[str, object]] | None:
    """The estimate from eager and fused attention timed in the job after its window (``attention_timing``):
    what one layer's forward and backward would save, times the layers and the micro-batches of a step,
    over the mean step time."""
    rank = next((r for r in ctx.profile.ranks if r.attention_timing is not None and r.steps), None)
    layers = ctx.env.model.n_layers
    if rank is None or not layers:
        return None
    t = rank.attention_timing
    assert t is not None
    if t.fused_s <= 0:
        return None
    micro = statistics.fmean(max(s.micro_batches, 1) for s in rank.steps)
    step_s = rank.wall_s / len(rank.steps)
    saved_s = max(0.0, t.eager_s - t.fused_s) * layers * micro
    share = min(saved_s / max(step_s, 1e-9), 0.95)
    where = "GPU" if ctx.env.device == Device.CUDA else "CPU"
    basis = (
        f"one layer's attention timed on this {where} after the window at the job's shapes ({t.rows} rows × "
        f"{t.heads} heads × {t.seq} tokens × {t.head_dim}, {t.dtype}, forward and backward): eager "
        f"{t.eager_s * 1000:.2f} ms, fused SDPA {t.fused_s * 1000:.2f} ms; × {layers} layers"
        + (f" × {micro:.0f} micro-batches" if micro > 1 else "")
        + f" = {saved_s * 1000:.1f} ms of the {step_s * 1000:.0f} ms step"
        + ("" if t.eager_s > t.fused_s else " (the fused kernel was not faster here)")
    )
    measured: dict[str, object] = {
        "eager_ms_per_layer": round(t.eager_s * 1000, 3),
        "fused_ms_per_layer": round(t.fused_s * 1000, 3),
        "attention_saved_frac": round(share, 3),
    }
    return amdahl(share, float("inf")), basis, measured


def no_mixed_precision(ctx: RuleContext) -> Finding | None:
    if not ctx.gpu_possible:
        return None
    gpu = ctx.gpu
    if gpu is not None and not gpu.has_fast_low_precision:
        return None
    dtype = ctx.metrics.compute_dtype
    fp32_gemm = ctx.trace_mean("fp32_gemm_frac")
    traced = fp32_gemm is not None and fp32_gemm >= 0.5 and ctx.on_gpu
    act = read_activity(ctx.profile)
    counted = act is not None and act.tensor_idle and ctx.on_gpu  # tensor pipes idle while the SMs work
    if not traced and dtype not in ("fp32", "tf32") and not (counted and dtype is None):
        return None
    if not ctx.on_gpu and ctx.env.device is not None:
        return None
    if traced or dtype is None:
        dtype = "fp32"  # fp32 GEMMs in the trace; or idle tensor pipes, which TF32 would use too
    bf16_ok = gpu is None or gpu.peak_flops("bf16") is not None
    low = "bf16" if bf16_ok else "fp16"
    evidence: dict[str, object] = {
        "param_dtype": ctx.env.param_dtype,
        "autocast_dtype": ctx.env.autocast_dtype,
        "tf32": ctx.env.tf32,
        "gpu": gpu.key if gpu else ctx.env.gpu_name,
    }
    if fp32_gemm is not None:
        evidence["fp32_gemm_time_frac"] = round(fp32_gemm, 3)
    factor = 2.0 if dtype == "tf32" else 3.0
    if gpu is not None:
        now_peak = gpu.peak_flops(dtype or "fp32") or gpu.peak_flops("fp32")
        low_peak = gpu.peak_flops(low)
        if now_peak and low_peak:
            evidence["peak_ratio"] = round(low_peak / now_peak, 1)
            factor = min(factor, low_peak / now_peak)
    c = ctx.compute_frac
    measured = ctx.measured
    if act is not None and "tensor_active" in act.means:
        evidence.update(act.evidence())
    how = (
        "GEMM kernels in the trace run in plain fp32"
        if traced
        else f"the tensor pipes are idle while the SMs work ({act.words()})"
        if counted and act is not None and ctx.metrics.compute_dtype is None
        else (
            f"matrix math runs in {str(dtype).upper()}"
            + (
                " without TF32 or bf16/fp16 autocast"
                if dtype == "fp32"
                else " (TF32) without bf16/fp16 autocast"
            )
        )
    )
    return Finding(
        cause=CauseId.NO_MIXED_PRECISION,
        severity=Severity.HIGH if dtype == "fp32" else Severity.MEDIUM,
        confidence=_precision_confidence(measured, counted, act),
        summary=f"{how[0].upper() + how[1:]} on a GPU whose {low} tensor cores are much faster."
        + _tensor_words(act, counted),
        evidence=evidence,
        est_speedup=amdahl(c, factor) if measured else None,
        speedup_basis=(
            f"compute is {c:.0%} of the step; {low} taken as {factor:.1f}× faster for it "
            "(capped below the datasheet peak ratio because not all compute is matmul)"
        )
        if measured
        else "config only: no step time measured",
        fix=advise(ctx.framework, *precision_uses(bf16_ok, dtype == "tf32")),
    )


def _precision_confidence(measured: bool, counted: bool, act: Activity | None) -> float:
    """How sure: per-step data or a trace say 0.85, configs 0.6; the tensor counter read idle raises it
    (the matrix math is off the tensor cores, measured), read busy lowers it (the counters disagree)."""
    base = 0.85 if measured else 0.6
    if counted:
        return 0.95 if measured else 0.8
    if act is not None and act.tensor_busy:
        return min(base, 0.4)
    return base


def _tensor_words(act: Activity | None, counted: bool) -> str:
    if act is None or "tensor_active" not in act.means:
        return ""
    if counted:
        return f" The tensor-pipe counter confirms it: {act.get('tensor_active'):.1%} busy."
    if act.tensor_busy:
        return (
            f" But the tensor pipes read {act.get('tensor_active'):.0%} busy: some matrix math does use them."
        )
    return ""


def _busy_while_computing(ctx: RuleContext) -> tuple[float | None, dict[str, object], str]:
    """The GPU busy share small_batch judges by, its evidence, and the words for it.

    From GPU samples: per GPU, over the job's active time only (gpu_windows.py), averaged over the GPUs
    that worked; a GPU that never worked is idle_gpu's and a pause of the job is not an under-filled
    batch. From a trace alone: the trace's kernel-busy share of the step."""
    m = ctx.metrics
    windows = working(ctx.results.gpus)
    if m.source_of_util not in ("nvml", "nvidia-smi"):
        return m.gpu_util, {}, "of the time"
    evidence: dict[str, object] = {
        "gpu_util_active": None if m.gpu_util_active is None else round(m.gpu_util_active, 3),
        "gpu_active_frac": None if m.gpu_active_frac is None else round(m.gpu_active_frac, 3),
        "gpu_util_active_per_gpu": {
            str(w.gpu): round(w.active_util, 3) for w in windows if w.active_util is not None
        },
        "idle_gpus_left_out": [w.gpu for w in ctx.results.gpus if w.never_busy],
    }
    whole = m.gpu_active_frac is not None and m.gpu_active_frac >= 0.995
    when = "of the time" if whole else "while the job computes"
    if len(windows) > 1:
        when += f" (mean of GPUs {', '.join(str(w.gpu) for w in windows)})"
    return m.gpu_util_active, evidence, when


def small_batch(ctx: RuleContext) -> Finding | None:
    if not ctx.on_gpu:
        return None
    m = ctx.metrics
    util, active_evidence, when = _busy_while_computing(ctx)
    act = read_activity(ctx.profile)
    starved = act is not None and act.starved
    if util is None or util >= 0.75:
        if not starved or act is None:
            return None
        return _small_batch_counted(ctx, util, act)
    if (m.data_wait_frac or 0.0) >= 0.15:
        return None  # the idle time is the input pipeline's; dataloader_bound explains it
    mem = m.gpu_mem_used_frac
    if mem is not None and mem > 0.85:
        return None  # no room for a bigger batch
    launch_bound = any(t.launch_bound for t in ctx.traces)
    tiny = ctx.trace_mean("tiny_kernel_frac")
    est = min(1.0 / max(util, 0.05), 4.0)
    evidence: dict[str, object] = {
        "gpu_util": None if m.gpu_util is None else round(m.gpu_util, 3),  # whole-window mean, as before
        "util_source": m.source_of_util,
        "gpu_mem_used_frac": None if mem is None else round(mem, 3),
        "micro_batch_size": ctx.env.micro_batch_size,
        "grad_accum_steps": ctx.env.grad_accum_steps,
        "tokens_per_micro_batch": None
        if m.tokens_per_micro_batch is None
        else round(m.tokens_per_micro_batch),
        **active_evidence,
    }
    if tiny is not None:
        evidence["tiny_kernel_frac"] = round(tiny, 3)
        evidence["launch_bound"] = launch_bound
    planned = planned_micro_batch(ctx)
    if planned is not None:
        evidence["plan_max_micro_batch"] = planned
        if planned <= (ctx.env.micro_batch_size or 1):
            return (
                None  # the planner says a bigger micro-batch would not fit: the idle time has another cause
            )
    confidence = 0.7 if mem is not None or ctx.traces else 0.5
    if m.source_of_util == "nvidia-smi" and m.data_wait_frac is None:
        confidence = 0.4  # a log cannot tell a small batch from a slow input pipeline
    if starved and act is not None:  # the counters agree: the SMs are mostly empty too
        confidence = min(0.9, confidence + 0.15)
        evidence.update(act.evidence())
    detail = (
        f" with {m.tokens_per_micro_batch:.0f} tokens per micro-batch" if m.tokens_per_micro_batch else ""
    )
    if launch_bound:
        detail += " and most kernels shorter than 10 µs (launch-bound)"
    return Finding(
        cause=CauseId.SMALL_BATCH,
        severity=severity_for(1 - util, 0.6, 0.35),
        confidence=confidence,
        summary=(
            f"The GPU is busy only {util:.0%} {when}{detail}"
            + (f" and has {1 - mem:.0%} of its memory free" if mem is not None else "")
            + ": the work per step is too small to fill it."
        ),
        evidence=evidence,
        est_speedup=est,
        speedup_basis=f"GPU busy share {when} ({m.source_of_util}, measured); filling the idle share gives at "
        "most 1/util (capped at 4×)",
        fix=advise(ctx.framework, micro_batch_use(ctx, planned)),
    )


def _small_batch_counted(ctx: RuleContext, util: float | None, act: Activity) -> Finding | None:
    """Utilization reads high (or was not logged) but the SMs are mostly empty: kernels too small to fill
    the GPU, which utilization cannot show (one small kernel at a time reads 100 %)."""
    m = ctx.metrics
    if (m.data_wait_frac or 0.0) >= 0.15:
        return None
    mem = m.gpu_mem_used_frac
    if mem is not None and mem > 0.85:
        return None  # no room for a bigger batch
    planned = planned_micro_batch(ctx)
    if planned is not None and planned <= (ctx.env.micro_batch_size or 1):
        return None
    sm, occ = act.get("sm_active"), act.get("sm_occupancy")
    fill = sm if sm is not None else (occ or 0.0) / OCC_FULL
    evidence: dict[str, object] = {
        "gpu_util": None if util is None else round(util, 3),
        "util_source": m.source_of_util,
        "gpu_mem_used_frac": None if mem is None else round(mem, 3),
        "micro_batch_size": ctx.env.micro_batch_size,
        "plan_max_micro_batch": planned,
        **act.evidence(),
    }
    launch_bound = any(t.launch_bound for t in ctx.traces)
    agree = launch_bound or (sm is not None and occ is not None and sm < SM_FULL and occ < OCC_FULL)
    reads = f"Utilization reads {util:.0%}, but " if util is not None else ""
    return Finding(
        cause=CauseId.SMALL_BATCH,
        severity=severity_for(1 - fill, 0.6, 0.35),
        confidence=0.75 if agree else 0.6,
        summary=(
            f"{reads}the hardware counters show the SMs mostly empty ({act.words()}): the kernels are too "
            "small to fill the GPU, which utilization (some kernel running) cannot show."
        ),
        evidence=evidence,
        est_speedup=min(SM_FULL / max(fill, 0.05), 4.0) if fill < SM_FULL else None,
        speedup_basis=f"SM activity {fill:.0%} (measured) raised toward {SM_FULL:.0%} by more work per kernel; "
        "capped at 4×",
        fix=advise(ctx.framework, micro_batch_use(ctx, planned)),
    )


def planned_micro_batch(ctx: RuleContext) -> int | None:
    """The largest micro-batch `pitstop plan` predicts for this run's model, sequence length and GPU, or None
    when the run did not reveal enough of them."""
    seq = ctx.metrics.seq_len or ctx.env.max_seq_len
    gpu_bytes = ctx.env.gpu_memory_bytes or (ctx.gpu.memory_gib * GIB if ctx.gpu else None)
    setup = setup_for_run(ctx.env, seq=round(seq or 0), gpus=ctx.profile.world_size)
    if setup is None or not has_shape(setup) or not gpu_bytes:
        return None
    return largest_micro_batch(setup, gpu_bytes)


def host_sync(ctx: RuleContext) -> Finding | None:
    """Blocking syncs cost what the host spends blocked in them: while it waits it cannot queue the next
    kernels, so the GPU drains and then idles. Syncs on an already idle (host-bound) GPU block for ~0 and
    are not the cause; the idle-time rules cover that case."""
    if not ctx.on_gpu:
        return None
    m = ctx.metrics
    per_step = ctx.trace_mean("syncs_per_step")
    blocked = None
    if per_step is not None:
        sync_ms, step_ms = ctx.trace_mean("sync_ms"), ctx.trace_mean("step_ms")
        blocked = (sync_ms / step_ms) if sync_ms is not None and step_ms else None
    else:
        per_step, blocked = m.syncs_per_step, m.sync_frac
    if per_step is None or per_step < 1 or blocked is None or blocked < 0.02:
        return None
    util = m.gpu_util
    act = read_activity(ctx.profile)
    starved = act is not None and act.starved
    if util is not None and util >= 0.95 and not starved:
        return None  # (a utilization that reads full while the SMs are empty says nothing)
    evidence: dict[str, object] = {
        "syncs_per_step": round(per_step, 2),
        "blocked_frac_of_step": round(blocked, 3),
        "gpu_util": None if util is None else round(util, 3),
    }
    if act is not None:
        evidence.update(act.evidence())
    splits = [t.idle_split.get("host_wait") for t in ctx.traces if t.idle_split]
    if splits:
        evidence["idle_that_is_host_wait"] = round(max(s for s in splits if s is not None), 3)
    return Finding(
        cause=CauseId.HOST_SYNC,
        severity=Severity.HIGH
        if blocked >= 0.25
        else (Severity.MEDIUM if blocked >= 0.05 and per_step >= 2 else Severity.LOW),
        confidence=0.8 if starved else 0.7,  # the counters agree: the GPU is not kept full
        summary=(
            f"The host blocks on the GPU {per_step:.1f} times per step (.item(), .cpu(), synchronize) and waits "
            f"{blocked:.0%} of the step there, so the launch queue drains and the GPU idles while the next "
            "kernels are issued."
            + (f" The hardware counters agree: {act.words()}." if starved and act is not None else "")
        ),
        evidence=evidence,
        est_speedup=amdahl(blocked, float("inf")),
        speedup_basis="host time blocked in synchronizing calls (measured) bounds what removing them wins",
        fix=advise(ctx.framework, use(RemedyId.FEWER_SYNCS)),
    )


def communication_bound(ctx: RuleContext) -> Finding | None:
    """Communication the ranks sit blocked in (live, timed collectives), or NCCL time that does not overlap
    compute kernels (from traces)."""
    if ctx.ranks is not None:
        return _communication_live(ctx)
    rows = [
        (t.nccl_ms, t.nccl_overlap_frac, t.step_ms)
        for t in ctx.traces
        if t.nccl_ms and t.step_ms and t.nccl_overlap_frac is not None
    ]
    if not rows:
        return None
    exposed = max(nccl * (1 - overlap) / step for nccl, overlap, step in rows)
    share = max(nccl / step for nccl, _, step in rows)
    # ranks aligned across traces: time spent waiting for a late rank is the straggler's, not the link's
    aligned = [
        t.exposed_comm_ms / t.step_ms for t in ctx.traces if t.exposed_comm_ms is not None and t.step_ms
    ]
    exposed = max(aligned) if aligned else exposed
    bandwidths = [t.bus_bandwidth_gbps for t in ctx.traces if t.bus_bandwidth_gbps]
    if exposed < 0.05:
        return None
    overlap = min(o for _, o, _ in rows)
    return Finding(
        cause=CauseId.COMMUNICATION_BOUND,
        severity=severity_for(exposed, 0.25, 0.10),
        confidence=0.75,
        summary=(
            f"Communication kernels take {share:.0%} of a step and only {overlap:.0%} of that time overlaps "
            f"compute: {exposed:.0%} of the step waits on the interconnect."
        ),
        evidence={
            "nccl_frac_of_step": round(share, 3),
            "nccl_overlap_frac": round(overlap, 3),
            "exposed_frac_of_step": round(exposed, 3),
            "exposed_comm_frac": round(exposed, 3),
            **({"bus_bandwidth_gbps": round(statistics.median(bandwidths), 1)} if bandwidths else {}),
        },
        est_speedup=amdahl(exposed, float("inf")),
        speedup_basis="NCCL kernel time not covered by compute kernels (trace); hiding it gives at most 1/(1−f)",
        fix=advise(ctx.framework, use(RemedyId.OVERLAP_COMM, zero_stage=ctx.env.zero_stage)),
    )


def _accumulation(ctx: RuleContext, a: RanksAnalysis) -> tuple[float, float, float, bool]:
    """(micro-batches per step, collectives per step, bytes per step, whether every micro-batch all-reduces
    the gradients): more bytes per step than one set of fp16 gradients, or, the model's size unknown, at least
    one collective per micro-batch."""
    micro = (
        statistics.median(s.micro_batches for r in ctx.profile.ranks for s in r.steps) if ctx.measured else 0
    )
    per_step = statistics.fmean(r.collectives_per_step for r in a.ranks)
    bytes_per_step = statistics.fmean(r.bytes_per_step for r in a.ranks)
    params = ctx.env.model.params_trainable or ctx.env.model.params_total
    no_sync = micro >= 2 and (bytes_per_step >= 3 * params if params else per_step >= micro)
    return micro, per_step, bytes_per_step, no_sync


def _communication_live(ctx: RuleContext) -> Finding | None:
    from pitstop.interconnect import transport

    a = ctx.ranks
    assert a is not None
    exposed = a.mean_frac("comm_s")
    moving = sum(b.transfer_s_per_step for b in a.bandwidth) / a.step_s if a.step_s > 0 else 0.0
    env = ctx.env
    micro, per_step, bytes_per_step, no_sync = _accumulation(ctx, a)
    # On a CPU the transfers and their reductions run on the cores that compute: what overlaps the backward
    # still takes its time from it. no_sync removes that time, overlapped or not; no other fix the rule
    # advises does on a CPU, so without accumulation the exposed share stands. A GPU computes meanwhile.
    cost = max(exposed, min(moving, MAX_COMM_SHARE)) if no_sync and not ctx.on_gpu else exposed
    if cost < 0.05:
        return None
    link = transport(env.dist_backend, env.device, env.gpu_name, env.nodes, env.comm_env)
    main = max(a.bandwidth, key=lambda b: b.bytes_per_step, default=None)
    evidence: dict[str, object] = {
        "exposed_frac_of_step": round(exposed, 3),
        "exposed_ms_per_step": round(statistics.fmean(r.comm_s for r in a.ranks) * 1000, 2),
        "moving_frac_of_step": round(moving, 3),
        "collectives_per_step": round(statistics.fmean(r.collectives_per_step for r in a.ranks), 2),
        "bytes_per_step": round(statistics.fmean(r.bytes_per_step for r in a.ranks)),
        "bandwidth": {
            b.op: {
                "algbw_gbps": None if b.algbw_gbps is None else round(b.algbw_gbps, 3),
                "busbw_gbps": None if b.busbw_gbps is None else round(b.busbw_gbps, 3),
                "mb_per_step": round(b.bytes_per_step / 1e6, 2),
            }
            for b in a.bandwidth
        },
        "transport": link.name,
        "link": None if link.link is None else link.link.key,
        "expected_busbw_gbps": None if link.link is None else round(link.link.expected_busbw_gbps, 1),
        "link_basis": link.basis,
        "backend": env.dist_backend,
    }
    evidence.update(_planned_comm(ctx, link.link))
    likely: list[str] = []
    bw = ""
    if main is not None and main.busbw_gbps is not None:
        bw = f"{main.op}: {main.bytes_per_step / 1e6:.1f} MB per step at {main.busbw_gbps:.2f} GB/s bus bandwidth"
        if link.link is not None:
            bw += f" on a link that should give ~{link.link.expected_busbw_gbps:.0f} GB/s ({link.link.key})"
            if main.busbw_gbps < 0.5 * link.link.expected_busbw_gbps:
                likely.append("transport")
        else:
            bw += f" ({link.basis})"
    if link.warnings:
        evidence["transport_warnings"] = list(link.warnings)
        likely.append("nccl_backend" if env.dist_backend == "gloo" else "transport")
    per_call = bytes_per_step / max(per_step, 1e-9)
    if per_step >= 50 and per_call < 1e6:
        likely.append("bigger_buckets")
    if no_sync:
        likely.append("no_sync_accumulation")
    evidence["likely_causes"] = sorted(set(likely))
    est, basis = _comm_estimate(cost, exposed, ctx.on_gpu, micro if no_sync else 0)
    shared = (
        "" if ctx.on_gpu or cost == exposed else f"; data moves {moving:.0%} of it on the cores that compute"
    )
    return Finding(
        cause=CauseId.COMMUNICATION_BOUND,
        severity=severity_for(cost, 0.25, 0.10),
        confidence=0.8,
        summary=(
            f"Communication exposes {exposed:.0%} of each step (ranks blocked while data moves, after the "
            f"last rank arrived){shared}" + (f": {bw}." if bw else ".")
        ),
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=advise(ctx.framework, *_comm_uses(ctx, evidence, link.warnings, per_step, per_call, micro)),
    )


MAX_COMM_SHARE = 0.95  # the moving share is a sum over kinds of collective: never all of the step


def _comm_estimate(cost: float, exposed: float, on_gpu: bool, micro: float) -> tuple[float, str]:
    """What the first fix saves. ``no_sync`` on ``micro`` micro-batches drops the all-reduces of all but the
    last (their share of the communication cost); otherwise hiding the cost entirely is the bound."""
    what = (
        "timed collectives: blocked time after the last rank arrived"
        if on_gpu or cost == exposed
        else "timed collectives: the time data moves (on a CPU the transfers and reductions take the cores "
        "that compute, overlapped or not)"
    )
    if micro >= 2:
        gone = (micro - 1) / micro
        return amdahl(cost * gone, float("inf")), (
            f"{what}; all-reducing once per optimizer step instead of per micro-batch removes "
            f"{micro - 1:g} of {micro:g} of it"
        )
    return amdahl(cost, float("inf")), f"{what}; hiding it gives at most 1/(1−f)"


def _planned_comm(ctx: RuleContext, network: Link | None) -> dict[str, object]:
    """What ``pitstop plan`` predicts for this world size, sharding and link (plan/comm), when the model's
    size and the GPU are known: the same figures the plan shows, beside the measured ones."""
    from pitstop.hardware import lookup_gpu
    from pitstop.plan.comm import setup_comm, strategy_of

    env = ctx.env
    gpu = lookup_gpu(env.gpu_name)
    s = setup_for_run(env, gpus=ctx.profile.world_size)
    if gpu is None or s is None or s.gpus < 2:
        return {}
    cp = setup_comm(s, gpu, s.nodes, network if s.nodes > 1 else None, max(env.grad_accum_steps or 1, 1))
    return {
        "planned_strategy": strategy_of(s.zero, s.sharding, s.hpz),
        "planned_gb_on_the_bus_per_step": round(cp.bus_bytes / 1e9, 3),
        "planned_comm_s_per_step": round(cp.seconds, 4),
        "planned_basis": "pitstop plan's communication model (plan/comm): ring volumes at 80% of "
        + " / ".join(sorted({c.link.key for c in cp.collectives})),
    }


def _comm_uses(
    ctx: RuleContext,
    evidence: dict[str, object],
    warnings: tuple[str, ...] | list[str],
    per_step: float,
    per_call: float,
    micro: float,
) -> list[Use]:
    """The remedies for the causes the evidence points at, most specific first; overlap always applies."""
    raw = evidence.get("likely_causes")
    likely = set(raw) if isinstance(raw, list) else set()
    uses: list[Use] = []
    if "transport" in likely:
        uses.append(use(RemedyId.FIX_TRANSPORT, warnings=list(warnings), multi_node=(ctx.env.nodes or 1) > 1))
    if "nccl_backend" in likely:
        uses.append(use(RemedyId.NCCL_BACKEND))
    if "bigger_buckets" in likely:
        uses.append(
            use(RemedyId.BIGGER_BUCKETS, per_step=round(per_step), mb_per_call=round(per_call / 1e6, 3))
        )
    if "no_sync_accumulation" in likely:
        uses.append(use(RemedyId.NO_SYNC_ACCUMULATION, micro_batches=int(micro)))
    return [*uses, use(RemedyId.OVERLAP_COMM, zero_stage=ctx.env.zero_stage)]


def low_mfu_unexplained(ctx: RuleContext) -> Finding | None:
    if not ctx.on_gpu:
        return None
    m = ctx.metrics
    if m.mfu is None:
        return None
    floor = EXPECTED_MFU[0] * 0.6
    if m.mfu >= floor:
        return None
    if any(f.severity == Severity.HIGH for f in ctx.earlier):
        return None  # a named cause already explains the gap
    if m.gpu_util is not None and m.gpu_util < 0.85:
        return None  # an idle GPU is explained by the idle-time rules
    busy = "" if m.gpu_util is None else f"The GPU is {m.gpu_util:.0%} busy but "
    act = read_activity(ctx.profile)
    bound = act if act is not None and act.memory_bound else None
    evidence: dict[str, object] = {
        "mfu": round(m.mfu, 4),
        "gpu_util": None if m.gpu_util is None else round(m.gpu_util, 3),
        "gpu": m.gpu,
        "compute_dtype": m.compute_dtype,
    }
    if act is not None:
        evidence.update(act.evidence(), memory_bound=bound is not None)
    confidence = 0.5 if m.gpu_util is not None else 0.35
    return Finding(
        cause=CauseId.LOW_MFU_UNEXPLAINED,
        severity=Severity.MEDIUM,
        confidence=confidence + (0.15 if bound is not None else 0.0),
        summary=(
            f"{busy}{'reaches' if busy else 'The run reaches'} only {m.mfu:.1%} MFU; well-tuned fine-tunes reach "
            f"{EXPECTED_MFU[0]:.0%}–{EXPECTED_MFU[1]:.0%} on this GPU."
            + (
                f" The counters say the step is memory-bound ({bound.words()}): unfused elementwise work, not "
                "matrix math, sets its pace."
                if bound is not None
                else ""
            )
            + (
                ""
                if m.gpu_util is not None
                else " Without per-step data the cause is not known: run `pitstop doctor` or record a trace."
            )
        ),
        evidence=evidence,
        est_speedup=min(EXPECTED_MFU[0] / max(m.mfu, 1e-6), 4.0),
        speedup_basis=f"reaching the low end of the expected MFU range ({EXPECTED_MFU[0]:.0%}); capped at 4×",
        fix=advise(ctx.framework, use(RemedyId.FUSED_KERNELS)),
    )


def attention_target(ctx: RuleContext) -> dict[str, object]:
    """What the attention advice loads: FlashAttention 2 on a GPU (SDPA as the no-install alternative), SDPA
    elsewhere; and whether the model is a transformers model (then the fix is a loading argument)."""
    on_gpu = ctx.env.device not in (None, Device.CPU)
    model = ctx.env.model
    hf_model = True if model.library == "transformers" or model.model_type else None
    mha = bool(
        ctx.env.attention.implementation and "nn.MultiheadAttention" in ctx.env.attention.implementation
    )
    if on_gpu and not mha:
        return {"target": "flash_attention_2", "alternative": "sdpa", "hf_model": hf_model}
    return {"target": "sdpa", "hf_model": hf_model, "mha": mha}


def precision_uses(bf16_ok: bool, tf32_only: bool) -> list[Use]:
    """Mixed precision in the low type the GPU has tensor cores for; TF32 for what stays fp32."""
    low = use(RemedyId.BF16) if bf16_ok else use(RemedyId.FP16)
    return [low] if tf32_only or not bf16_ok else [low, use(RemedyId.TF32)]


def micro_batch_use(ctx: RuleContext, planned: int | None) -> Use:
    """The micro-batch to move to, from the planner when it knows the model and GPU; without today's
    micro-batch no number is made up."""
    micro, accum = ctx.env.micro_batch_size, ctx.env.grad_accum_steps
    if not micro:
        basis = f"`pitstop plan` predicts up to {planned} fits" if planned else None
        return use(RemedyId.MICRO_BATCH, planned=planned, basis=basis)
    step = next_micro_batch(micro, accum or 1, planned)
    if step is None:
        return use(RemedyId.MICRO_BATCH, micro=micro, accum=accum, planned=planned)
    basis = (
        f"`pitstop plan` predicts up to {planned} fits"
        if planned
        else "doubling: the planner did not size this run"
    )
    return use(
        RemedyId.MICRO_BATCH,
        micro=micro,
        accum=accum or 1,
        new_micro=step[0],
        new_accum=step[1],
        planned=planned,
        basis=basis,
    )
