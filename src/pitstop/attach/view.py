"""One window's samples sorted into the job's processes: which are ranks (a training loop's main thread),
which are DataLoader workers, which is the launcher; each rank's phases, shares and steps."""

from __future__ import annotations

from dataclasses import dataclass, field

from pitstop.attach import procs
from pitstop.attach.classify import Phase, classify, framework_of, in_optimizer_step, is_worker, loader_kind
from pitstop.attach.sampler import Window
from pitstop.attach.shares import Share, StepCount, count_steps, phase_shares
from pitstop.attach.stacks import ThreadSamples


@dataclass
class RankView:
    """A training process as the samples of its main thread show it."""

    pid: int
    rank: int
    local_rank: int
    main: ThreadSamples
    phases: list[Phase]
    shares: dict[Phase, Share]
    steps: StepCount
    framework: str | None
    loader: str | None  # 'single' (num_workers=0), 'multi', or None (not seen)
    workers: list[int] = field(default_factory=list)
    threads: int | None = None
    cpu_pct: float | None = None
    workers_cpu_pct: float | None = None
    runnable: float | None = None
    cores_allowed: int | None = None
    gpus: list[int] = field(default_factory=list)

    @property
    def step_rate(self) -> float | None:
        """Steps per second over the span the counted steps cover (an estimate: see StepCount)."""
        if self.steps.steps < 1:
            return None
        span = (self.steps.starts[-1] - self.steps.starts[0]) * self.main.interval_s
        return self.steps.steps / span if span > 0 else None


@dataclass
class JobView:
    window: Window
    ranks: list[RankView]
    workers: list[int]
    others: list[int]  # the launcher and any process that is neither a rank nor a worker
    launcher: str | None = None  # "torchrun" when torch elastic started the ranks
    notes: list[str] = field(default_factory=list)


def job_view(window: Window) -> JobView:
    """Sort the window's processes; a process whose main thread shows no training phase and no RANK is not
    a rank (a launcher, a tokenizer server, a logger)."""
    mains = {t.pid: t for t in window.threads if t.is_main}
    workers = [pid for pid, t in mains.items() if is_worker(t.stacks)]
    candidates = []
    for pid, main in sorted(mains.items()):
        if pid in workers:
            continue
        env = procs.environ(pid, "RANK", "LOCAL_RANK")
        phases = [classify(s) for s in main.stacks]
        if "RANK" in env or any(p is not Phase.OTHER for p in phases):
            candidates.append((pid, main, phases, env))
    ranks = [_rank_view(i, window, workers, *c) for i, c in enumerate(candidates)]
    ranks.sort(key=lambda r: r.rank)
    others = [pid for pid in mains if pid not in workers and pid not in {r.pid for r in ranks}]
    view = JobView(window, ranks, workers, others)
    torchrun = ("torchrun", "torch.distributed.run", "torch/distributed/run.py")
    if any(any(mark in " ".join(procs.cmdline(pid)) for mark in torchrun) for pid in others):
        view.launcher = "torchrun"
    missing = [t.pid for t in window.threads if t.pid not in mains]
    if missing:
        view.notes.append(f"processes {sorted(set(missing))} had no main-thread samples")
    return view


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def _rank_view(
    order: int,
    window: Window,
    workers: list[int],
    pid: int,
    main: ThreadSamples,
    phases: list[Phase],
    env: dict[str, str],
) -> RankView:
    in_step = [in_optimizer_step(s) for s in main.stacks]
    mine = [w for w in workers if procs.parent(w) == pid]
    series = window.procs.get(pid)
    worker_cpu = [window.procs[w].cpu_pct() for w in mine if w in window.procs]
    known = [c for c in worker_cpu if c is not None]
    return RankView(
        pid=pid,
        rank=_int(env.get("RANK"), order),
        local_rank=_int(env.get("LOCAL_RANK"), order),
        main=main,
        phases=phases,
        shares=phase_shares(phases),
        steps=count_steps(phases, in_step),
        framework=framework_of(main.stacks),
        loader=loader_kind(main.stacks),
        workers=mine,
        threads=None if series is None else series.threads(),
        cpu_pct=None if series is None else series.cpu_pct(),
        workers_cpu_pct=sum(known) if known else None,
        runnable=None if series is None else series.runnable(),
        cores_allowed=procs.affinity(pid),
        gpus=procs.gpu_devices(pid),
    )
