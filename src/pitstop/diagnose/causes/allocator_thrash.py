"""allocator_thrash: the CUDA caching allocator keeps going back to the driver during the window.

In steady state every tensor comes from the allocator's cache. Allocation retries (the cache was freed whole
and cudaMalloc tried again), cudaMalloc / cudaFree calls step after step, or reserved memory far above what
tensors hold while memory is nearly full (fragmentation: free bytes split into blocks too small to reuse) all
cost synchronising driver calls. The counters are measured (``torch.cuda.memory_stats`` at each step's end);
what each call costs is an assumption, stated in the basis.

A profiler trace times the calls themselves: cudaMalloc / cudaFree / hipMalloc / hipFree taking a share of the
host's step (the caching allocator turned off with PYTORCH_NO_CUDA_MEMORY_CACHING=1, or flushed and refilled)
is the same cause, measured; removing that time leaves at least the GPU's own busy time."""

from __future__ import annotations

from pitstop.core.findings import Finding, use
from pitstop.core.profile import RankProfile, TraceStats
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, RuntimeApi, Workload
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.remedies import advise

GIB = 1024**3
ASSUMED_DRIVER_CALL_S = 1e-3  # one cudaMalloc / cudaFree, which synchronises the device
ASSUMED_RETRY_S = 20e-3  # a retry: the whole cache released, then cudaMalloc again
CHURN_STEPS = 0.5  # share of the window's steps with new cudaMalloc calls that counts as churn
FRAGMENTED = 1.5  # reserved / allocated
NEAR_FULL = 0.9  # reserved share of the GPU's memory
TRACE_ALLOC_FRAC = 0.05  # share of a traced step's host time in the allocator's driver calls


def _rank_evidence(
    rank: RankProfile, gpu_bytes: float | None
) -> tuple[int, int, int, dict[str, object]] | None:
    """(retries, driver calls, steps, evidence) of a rank whose allocator thrashed."""
    m = rank.memory
    steps = m.window_steps
    if not steps or m.window_device_allocs is None:
        return None
    retries = m.window_alloc_retries or 0
    allocs, frees = m.window_device_allocs or 0, m.window_device_frees or 0
    # the job empties the cache itself in most steps: that churn is per_step_cleanup's, and so is its fix
    flushed = any(
        c.call == "torch.cuda.empty_cache" and c.steps >= CHURN_STEPS * steps for c in rank.job_calls or []
    )
    churn = (m.steps_with_device_allocs or 0) / steps >= CHURN_STEPS and frees > 0 and not flushed
    ratio = m.reserved_mean / m.allocated_mean if m.reserved_mean and m.allocated_mean else None
    full = bool(gpu_bytes and m.reserved_mean and m.reserved_mean >= NEAR_FULL * gpu_bytes)
    fragmented = ratio is not None and ratio >= FRAGMENTED and full
    if not (retries or churn or fragmented):
        return None
    return (
        retries,
        allocs + frees,
        steps,
        {
            "rank": rank.rank,
            "steps": steps,
            "alloc_retries": retries,
            "cuda_mallocs": allocs,
            "cuda_frees": frees,
            "steps_with_cuda_malloc": m.steps_with_device_allocs,
            "reserved_gib": None if m.reserved_mean is None else round(m.reserved_mean / GIB, 2),
            "allocated_gib": None if m.allocated_mean is None else round(m.allocated_mean / GIB, 2),
            "reserved_over_allocated": None if ratio is None else round(ratio, 2),
            "fragmented_gib": None
            if m.inactive_split_mean is None
            else round(m.inactive_split_mean / GIB, 2),
            "near_full": full,
        },
    )


@cause(
    CauseId.ALLOCATOR_THRASH,
    title="The CUDA allocator thrashes",
    because=(
        "the caching allocator retries allocations, calls cudaMalloc / cudaFree step after step, or holds "
        "memory fragmented near the limit"
    ),
    needs_gpu=True,
    needs=((Evidence.PROCESS, Evidence.TRACE_KERNELS),),
    fires_when=(
        "`torch.cuda.memory_stats` over the window: allocation retries, cudaMalloc in ≥ {CHURN_STEPS:.0%} "
        "of the steps with cudaFree, or reserved ≥ {FRAGMENTED} × allocated near full memory (≥ "
        "{NEAR_FULL:.0%} reserved)"
    ),
    estimate=(
        "counters × assumed {ASSUMED_DRIVER_CALL_S_MS:.0f} ms per cudaMalloc / cudaFree and "
        "{ASSUMED_RETRY_S_MS:.0f} ms per retry; from a trace, the calls' measured time, at most 1 / the GPU's "
        "busy share"
    ),
    remedies=(RemedyId.EXPANDABLE_SEGMENTS,),
)
def allocator_thrash(ctx: RuleContext) -> Finding | None:
    if not ctx.on_gpu:
        return None
    gpu_bytes = ctx.env.gpu_memory_bytes or (ctx.gpu.memory_gib * GIB if ctx.gpu else None)
    found = [e for e in (_rank_evidence(r, gpu_bytes) for r in ctx.profile.ranks) if e is not None]
    if not found:
        return _from_trace(ctx)
    retries, calls, steps, worst = max(found, key=lambda e: (e[0], e[1]))
    lost_s = (calls * ASSUMED_DRIVER_CALL_S + retries * ASSUMED_RETRY_S) / steps
    step_s = ctx.metrics.step_time_s
    share = min(0.9, lost_s / step_s) if step_s else None
    what = []
    if retries:
        what.append(f"{retries} allocation retries (the cache flushed to make room)")
    if calls:
        what.append(f"{worst['cuda_mallocs']} cudaMalloc and {worst['cuda_frees']} cudaFree calls")
    if worst["near_full"] and worst["reserved_over_allocated"]:
        what.append(
            f"{worst['reserved_gib']} GiB reserved for {worst['allocated_gib']} GiB of tensors with memory nearly full"
        )
    return Finding(
        cause=CauseId.ALLOCATOR_THRASH,
        severity=severity_for(share or 0.0, 0.15, 0.05)
        if share is not None
        else severity_for(retries, 10, 1),
        confidence=0.8 if retries else 0.6,
        summary=f"The CUDA allocator thrashes: {'; '.join(what)} in {steps} measured steps (rank {worst['rank']}).",
        evidence={**worst, "ranks_affected": [e[3]["rank"] for e in found]},
        est_speedup=None if share is None else amdahl(share, float("inf")),
        speedup_basis=(
            f"measured counters × assumed {ASSUMED_DRIVER_CALL_S * 1e3:g} ms per cudaMalloc / cudaFree and "
            f"{ASSUMED_RETRY_S * 1e3:g} ms per retry, over the measured step"
        ),
        fix=advise(
            ctx.framework, use(RemedyId.EXPANDABLE_SEGMENTS, retries=retries, near_full=worst["near_full"])
        ),
    )


def _alloc_share(trace: TraceStats) -> float:
    return min(1.0, sum(c.frac_of_step for c in trace.runtime_calls if c.kind == RuntimeApi.ALLOC))


def _from_trace(ctx: RuleContext) -> Finding | None:
    """The allocator's driver calls timed in a trace: their share of the host's step and what the GPU did."""
    traced = [(r, t) for r, t in ctx.traced if _alloc_share(t) >= TRACE_ALLOC_FRAC]
    if not traced:
        return None
    rank, trace = max(traced, key=lambda rt: _alloc_share(rt[1]))
    share = _alloc_share(trace)
    calls = [c for c in trace.runtime_calls if c.kind == RuntimeApi.ALLOC]
    top = calls[0]
    unit = "batch" if trace.workload == Workload.INFERENCE else "step"
    whole = (trace.steps_from or "").startswith("no step markers")  # one window: the trace, not a step
    busy = trace.gpu_busy_frac
    est = amdahl(share, float("inf"))
    basis = f"host time in {', '.join(c.name for c in calls)} (trace, measured) removed"
    if busy:
        est = min(est, 1 / busy)
        basis += f"; the GPU was busy {busy:.0%} of the {'trace' if whole else unit}: at most ×{1 / busy:.2f}"
    names = " and ".join(f"{c.name} ({c.calls_per_step:g} calls, {c.frac_of_step:.1%})" for c in calls[:2])
    return Finding(
        cause=CauseId.ALLOCATOR_THRASH,
        severity=severity_for(share, 0.15, TRACE_ALLOC_FRAC),
        confidence=0.8,
        summary=(
            f"The host spends {share:.0%} of {'the traced time' if whole else 'each ' + unit} in the device "
            f"allocator's own calls: {names}{'' if whole else ' per ' + unit}"
            + (f", while the GPU is busy {busy:.0%}" if busy is not None else "")
            + ". PyTorch's caching allocator normally serves every tensor from its cache; here memory keeps "
            "going back to the driver, each call synchronising the device: the cache is turned off "
            "(PYTORCH_NO_CUDA_MEMORY_CACHING=1, also read on ROCm) or emptied every "
            f"{unit} (torch.cuda.empty_cache())."
        ),
        evidence={
            "rank": rank.rank,
            "alloc_frac_of_step": round(share, 3),
            "calls": {
                c.name: {
                    "calls_per_step": c.calls_per_step,
                    "ms_per_step": c.ms_per_step,
                    "gpu_busy": c.gpu_busy_frac,
                }
                for c in calls
            },
            "top_call": top.name,
            "gpu_busy_frac": busy,
            "steps_from": trace.steps_from,
        },
        est_speedup=est,
        speedup_basis=basis,
        fix=advise(ctx.framework, use(RemedyId.EXPANDABLE_SEGMENTS, retries=0, near_full=False)),
    )
