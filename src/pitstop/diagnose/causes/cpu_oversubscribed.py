"""cpu_oversubscribed: more busy threads than the cores the job may use.

Each training process runs torch's intra-op pool (``torch.get_num_threads()``, all the machine's cores by
default) and its DataLoader workers (one torch thread each). Several ranks on one machine each take the whole
default, and a container or ``taskset`` gives fewer cores than ``os.cpu_count()`` says: threads then wait for a
core, and OpenMP's barriers wait for the slowest thread. Thread counts come from the probe (the demand); the
job's runnable threads sampled during the window are the measured side. There is no speed-up figure: what
oversubscription costs depends on how much of the step is CPU work, which only a trial measures."""

from __future__ import annotations

import statistics

from pitstop.core.findings import Finding, use
from pitstop.core.profile import CpuThreads
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, Severity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext
from pitstop.remedies import advise

MARGIN = 1.25  # demand must exceed the cores by this factor: light workers beside a full pool are normal


def _busy_workers(ctx: RuleContext, workers: int) -> tuple[float, bool]:
    """Cores the DataLoader workers of one rank keep busy: measured (psutil) when sampled, else one each."""
    samples = [s for r in ctx.profile.ranks for s in r.host_samples if s.workers]
    if samples:
        return min(float(workers), statistics.fmean(s.workers_cpu_pct for s in samples) / 100.0), True
    return float(workers), False


def _others_runnable(cpu: CpuThreads, ranks: int) -> float | None:
    """Runnable threads of other processes on the cores the job may use: the machine's run queue less every
    local rank's own (each rank sampled its process), scaled to the job's share of the machine's cores when a
    cpuset or quota gives it fewer; None unless both queues were sampled."""
    machine, job = cpu.machine_run_queue, cpu.runnable_threads
    if machine is None or job is None or not cpu.cores_allowed:
        return None
    outside = max(0.0, machine - ranks * job)
    if cpu.machine_cores and cpu.machine_cores > cpu.cores_allowed:
        outside *= cpu.cores_allowed / cpu.machine_cores
    return round(outside, 2)


def _summary(cpu: CpuThreads, ranks: int, threads: int, workers: int, others: float | None) -> str:
    """Who competes for how many cores, what was measured, and (``others``: the other processes' runnable
    threads, when they alone fill the cores) what capping costs on a shared machine."""
    cores = cpu.cores_allowed
    who = f"{ranks} processes × ({threads} torch threads" if ranks > 1 else f"{threads} torch threads"
    who += f" + {workers} DataLoader workers" if workers else ""
    who += ")" if ranks > 1 else ""
    unset = ranks > 1 and cpu.omp_num_threads is None
    return (
        f"{who} compete for {cores} core{'s' if cores != 1 else ''}"
        + (
            f" (of the machine's {cpu.machine_cores})"
            if cpu.machine_cores and cpu.machine_cores != cores
            else ""
        )
        + (
            f"; {cpu.runnable_threads:g} of the job's threads were runnable on average (measured)"
            if cpu.runnable_threads is not None
            else ""
        )
        + (". OMP_NUM_THREADS is unset, so each process takes every core." if unset else ".")
        + (
            f" Other processes keep the cores busy too ({others:g} runnable threads besides the job's): "
            "with fewer threads the job also gets a smaller share of them, so capping its threads may slow "
            "it on this shared machine; it helps where the job has the cores to itself."
            if others is not None
            else ""
        )
    )


@cause(
    CauseId.CPU_OVERSUBSCRIBED,
    title="More busy threads than cores",
    because=(
        "torch's thread pools, DataLoader workers and ranks together run more threads than the cores the "
        "job may use, so threads wait for a core"
    ),
    needs_gpu=False,
    needs=(Evidence.PROCESS,),
    fires_when=(
        "ranks × (torch threads + busy DataLoader workers) > {MARGIN} × the cores allowed (affinity, "
        "cgroup quota); the job's runnable threads sampled from `/proc`"
    ),
    estimate="not estimated (depends on the step's CPU work; `tune` measures the fix)",
    remedies=(RemedyId.CPU_THREADS,),
)
def cpu_oversubscribed(ctx: RuleContext) -> Finding | None:
    cpu = ctx.env.cpu
    if cpu is None or not cpu.cores_allowed or not cpu.torch_threads:
        return None
    cores, threads = cpu.cores_allowed, cpu.torch_threads
    ranks = cpu.local_ranks or 1
    workers = ctx.env.dataloader.num_workers or 0
    busy_workers, measured_workers = _busy_workers(ctx, workers)
    demand = ranks * (threads + busy_workers)
    fair = max(1, round(cores / ranks - busy_workers))
    if demand <= MARGIN * cores or threads <= fair:
        return None
    evidence: dict[str, object] = {
        "cores_allowed": cores,
        "machine_cores": cpu.machine_cores,
        "cgroup_cores": cpu.cgroup_cores,
        "torch_threads": threads,
        "local_ranks": ranks,
        "dataloader_workers": workers,
        "busy_worker_cores": round(busy_workers, 2) if measured_workers else None,
        "thread_demand": round(demand, 2),
        "omp_num_threads": cpu.omp_num_threads,
        "runnable_threads": cpu.runnable_threads,
        "machine_run_queue": cpu.machine_run_queue,
        "steal_frac": cpu.steal_frac,
        "suggested_threads": fair,
    }
    measured_over = cpu.runnable_threads is not None and cpu.runnable_threads > cores
    others = _others_runnable(cpu, ranks)
    shared = others is not None and others >= cores  # other processes alone keep every core busy
    evidence["others_runnable"] = None if others is None else round(others, 2)
    ratio = demand / cores
    severity = (
        Severity.HIGH
        if ratio >= 3 and measured_over
        else Severity.MEDIUM
        if ratio >= 1.5 or measured_over
        else Severity.LOW
    )
    summary = _summary(cpu, ranks, threads, workers, others if shared else None)
    basis = f"{cores} cores / {ranks} process{'es' if ranks > 1 else ''}" + (
        f", minus {busy_workers:.1f} core{'s' if busy_workers != 1 else ''} the workers use"
        if busy_workers
        else ""
    )
    return Finding(
        cause=CauseId.CPU_OVERSUBSCRIBED,
        severity=severity,
        # on a shared machine the scheduler shares the cores per thread: fewer threads, a smaller share (a
        # calibration job at load 7 on 2 cores ran 2.4x slower with 2 threads than with 8)
        confidence=0.4 if shared else 0.8 if measured_over else 0.5,
        summary=summary,
        evidence=evidence,
        est_speedup=None,
        speedup_basis="not estimated: the cost depends on the step's CPU work; pitstop tune measures the fix",
        fix=advise(ctx.framework, use(RemedyId.CPU_THREADS, threads=fair, ranks=ranks, basis=basis)),
    )
