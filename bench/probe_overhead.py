"""Probe overhead: the same training loop with no observer, with pitstop's probe, and with torch.profiler.

The three modes run in interleaved blocks (A B C A B C ...) in one process, so machine noise hits all of
them alike; the figure is the ratio of median step times to the no-observer baseline, with the spread of
per-round ratios. The first steps of every block are dropped (the probe reads the environment on its
first step, a one-off that is not per-step overhead).

    python bench/probe_overhead.py                 # CPU, tiny Llama
    python bench/probe_overhead.py --device cuda   # on a GPU
    python bench/probe_overhead.py --gloo-ranks 2  # a 2-rank gloo DDP loop, every collective timed

    python bench/probe_overhead.py --own-batches   # no DataLoader: batches indexed from a token tensor,
                                                   # counted by the probe from the model's inputs

"pitstop watch" is the whole-run mode (the probe, every step's record read at its end, a window diagnosed and
written to TensorBoard every --watch-window steps).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "scripts"))
from common import TokenDataset, examples, pad_collate, tiny_llama

import pitstop


@contextlib.contextmanager
def no_observer() -> Iterator[None]:
    yield


@contextlib.contextmanager
def pitstop_probe() -> Iterator[None]:
    with pitstop.watch(steps=None, warmup=0, report=False):
        yield


WATCH_COST = {"steps": 0, "poll_s": 0.0, "window_s": 0.0, "windows": 0}  # time spent inside the step hook


@contextlib.contextmanager
def pitstop_whole_run(step_hook: list[Callable[[], None]], window: int, logdir: Path) -> Iterator[None]:
    """What ``PitstopCallback(mode="watch")`` does: the probe on every step, its new records read at each step
    end, a window diagnosed every ``window`` steps and written to TensorBoard."""
    from pitstop.integrations.session import Session
    from pitstop.integrations.watching import InProcessWatch
    from pitstop.report.trackers import TensorBoardTracker
    from pitstop.wholerun.windows import WindowSpec

    session = Session(steps=None, warmup=0, report=False, source="watch").start()
    watch = InProcessWatch(WindowSpec(steps=window), [TensorBoardTracker(logdir)], print_changes=False)

    def poll() -> None:
        if session.probe is not None:
            t0 = time.perf_counter()
            events = watch.poll(session.probe)
            spent = time.perf_counter() - t0
            WATCH_COST["steps"] += 1
            WATCH_COST["window_s" if events else "poll_s"] += spent
            WATCH_COST["windows"] += len(events)

    step_hook.append(poll)
    try:
        yield
    finally:
        step_hook.remove(poll)
        session.stop()
        watch.close(None, [])


@contextlib.contextmanager
def torch_profiler(step_hook: list[Callable[[], None]]) -> Iterator[None]:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        step_hook.append(prof.step)
        yield
        step_hook.clear()


class OwnBatches:
    """Batches a loop builds itself (no DataLoader): blocks of a token tensor, ``model(input_ids=x, labels=x)``."""

    def __init__(self, batch: int, block: int = 128) -> None:
        from common import VOCAB

        self.tokens = torch.randint(3, VOCAB, (batch * block * 64,))
        self.batch, self.block = batch, block

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        while True:
            ix = torch.randint(len(self.tokens) - self.block, (self.batch,)).tolist()
            x = torch.stack([self.tokens[i : i + self.block] for i in ix])
            yield {"input_ids": x, "labels": x}


def forward_hook_cost(batch: int, calls: int = 2000) -> float:
    """Seconds the probe adds to one outermost forward of an own-batches loop: its pre-hook's bookkeeping and
    counting the inputs, timed directly (a step-time ratio cannot resolve microseconds on a busy machine)."""
    from pitstop.probe.config import ProbeConfig
    from pitstop.probe.probe import Probe

    model = tiny_llama("sdpa", hidden=32, layers=1)
    probe = Probe(ProbeConfig(steps=None, warmup=0))
    probe.forward.adopt(model)
    x = next(iter(OwnBatches(batch)))["input_ids"]
    probe.forward.boundary = None  # the undecided case reads the version counters too: the dearer path
    t0 = time.perf_counter()
    for _ in range(calls):
        probe.on_forward(model, (), {"input_ids": x, "labels": x})
    probe.builder.end_step()
    return (time.perf_counter() - t0) / calls


def run_block(model: Any, opt: Any, loader: Any, device: str, steps: int, step_hook: list) -> list[float]:
    times = []
    it = iter(loader)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    for _ in range(steps):
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        for hook in step_hook:
            hook()
        sync()  # the benchmark's own clock needs the device done; the probe never does this
        times.append(time.perf_counter() - t0)
    return times


def ddp_worker(rank: int, world: int, init: str, args: argparse.Namespace, out: Path) -> None:
    """One rank of the gloo DDP loop: the probe (with collective timing) against no observer, in rotating
    blocks; a fresh DDP wrapper per block so the probe's DDP comm hook is in place exactly in its blocks."""
    import gc

    import torch.distributed as dist
    from torch.utils.data import DistributedSampler

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = tiny_llama("sdpa", hidden=args.hidden)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = TokenDataset(examples(4096, 0))
    loader = DataLoader(
        data, batch_size=args.batch, sampler=DistributedSampler(data, seed=0), collate_fn=pad_collate(None)
    )
    timed: list[int] = []

    @contextlib.contextmanager
    def probe() -> Iterator[None]:
        with pitstop.watch(steps=None, warmup=0, report=False) as session:
            yield
            timed.append(sum(r.collectives or 0 for r in session.probe.records))

    @contextlib.contextmanager
    def probe_without_collectives() -> Iterator[None]:
        from pitstop.probe.collectors.collectives import CollectiveRecorder

        install = CollectiveRecorder.install
        CollectiveRecorder.install = lambda self: None  # type: ignore[method-assign]
        try:
            with pitstop.watch(steps=None, warmup=0, report=False):
                yield
        finally:
            CollectiveRecorder.install = install  # type: ignore[method-assign]

    modes: dict[str, Callable[[], Any]] = {
        "none": no_observer,
        "pitstop": probe,
        "pitstop without collective timing": probe_without_collectives,
    }
    names = list(modes)
    medians: dict[str, list[float]] = {name: [] for name in modes}
    for round_index in range(args.rounds):
        shift = round_index % len(names)
        order = names[shift:] + names[:shift]
        for name in order:
            with modes[name]():
                ddp = torch.nn.parallel.DistributedDataParallel(model)
                times = run_block(ddp, opt, loader, "cpu", args.steps, [])
                del ddp
                gc.collect()
            medians[name].append(statistics.median(times[args.drop :]))
    if rank == 0:
        out.write_text(json.dumps({"medians": medians, "collectives_timed": sum(timed)}))
    dist.destroy_process_group()


def per_collective_cost(init: str, calls: int = 200, blocks: int = 20) -> float:
    """Seconds the recorder adds to one collective: a small all_reduce in a 1-rank gloo group, with and
    without the wrappers, in alternating blocks (the median of per-block differences)."""
    import torch.distributed as dist

    from pitstop.probe.collectors.collectives import CollectiveRecorder

    dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
    x = torch.ones(16)
    diffs = []
    for _ in range(blocks):
        per = []
        for observed in (False, True):
            rec = CollectiveRecorder(time.perf_counter(), lambda: 1, lambda exc: None)
            if observed:
                rec.install()
            t0 = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(x, async_op=True).wait()
            per.append((time.perf_counter() - t0) / calls)
            rec.remove()
        diffs.append(per[1] - per[0])
    dist.destroy_process_group()
    return statistics.median(diffs)


def main_gloo(args: argparse.Namespace) -> int:
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        cost = per_collective_cost(f"file://{tmp}/single")
        out = Path(tmp) / "result.json"
        mp.spawn(ddp_worker, args=(args.gloo_ranks, f"file://{tmp}/store", args, out), nprocs=args.gloo_ranks)
        result = json.loads(out.read_text())
    medians = result["medians"]
    base = statistics.median(medians["none"])
    ratios = [p / b for p, b in zip(medians["pitstop"], medians["none"], strict=True)]
    bare = [p / b for p, b in zip(medians["pitstop without collective timing"], medians["none"], strict=True)]
    paired = [
        p / b for p, b in zip(medians["pitstop"], medians["pitstop without collective timing"], strict=True)
    ]
    print(
        f"pitstop without collective timing / none: median {statistics.median(bare):.4f}; "
        f"pitstop / pitstop without collective timing: median {statistics.median(paired):.4f} "
        f"(per-round {min(paired):.4f} - {max(paired):.4f})"
    )
    result["ratio_without_collective_timing"] = statistics.median(bare)
    result["ratio_collective_timing_alone"] = statistics.median(paired)
    print(
        f"gloo ranks={args.gloo_ranks} rounds={args.rounds} steps/block={args.steps} "
        f"baseline median step {base * 1000:.2f} ms; collectives timed by the probe: {result['collectives_timed']}"
    )
    print(
        f"pitstop (collective timing on) / none: median {statistics.median(ratios):.4f} "
        f"(per-round {min(ratios):.4f} - {max(ratios):.4f})"
    )
    steps = args.rounds * args.steps
    per_step = result["collectives_timed"] / max(steps, 1)
    print(
        f"collective timing alone: {cost * 1e6:.1f} us per collective × {per_step:.1f} per step = "
        f"{cost * per_step / base:.4%} of the step"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "gloo_ranks": args.gloo_ranks,
                    "baseline_step_ms": base * 1000,
                    "ratio": statistics.median(ratios),
                    "ratio_min": min(ratios),
                    "ratio_max": max(ratios),
                    **result,
                },
                indent=1,
            )
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--steps", type=int, default=30, help="steps per block")
    parser.add_argument("--drop", type=int, default=3, help="first steps of a block not counted")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--gloo-ranks", type=int, default=0, help="run the 2-rank (or N-rank) gloo DDP loop")
    parser.add_argument(
        "--own-batches", action="store_true", help="no DataLoader: the loop builds its batches"
    )
    parser.add_argument(
        "--watch-window",
        type=int,
        default=10,
        help="whole-run mode: steps per window (10 diagnoses 20x as often as the default 200: an upper bound)",
    )
    args = parser.parse_args()
    if args.gloo_ranks:
        return main_gloo(args)
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    model = tiny_llama("sdpa", hidden=args.hidden).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader: Any = DataLoader(
        TokenDataset(examples(4096, 0)),
        batch_size=args.batch,
        shuffle=True,
        collate_fn=pad_collate(None),
        pin_memory=args.device == "cuda",
    )
    if args.own_batches:
        loader = OwnBatches(args.batch)
    step_hook: list[Callable[[], None]] = []
    logdir = Path(tempfile.mkdtemp(prefix="pitstop-bench-tb-"))
    modes: dict[str, Callable[[], Any]] = {
        "none": no_observer,
        "pitstop": pitstop_probe,
        "pitstop watch": lambda: pitstop_whole_run(step_hook, args.watch_window, logdir),
        "torch.profiler": lambda: torch_profiler(step_hook),
    }
    run_block(model, opt, loader, args.device, 10, step_hook)  # warm the allocator and kernels
    medians: dict[str, list[float]] = {name: [] for name in modes}
    names = list(modes)
    for round_index in range(args.rounds):
        order = (
            names[round_index % len(names) :] + names[: round_index % len(names)]
        )  # rotate: no mode always first
        for name in order:
            observer = modes[name]
            with observer():
                times = run_block(model, opt, loader, args.device, args.steps, step_hook)
            medians[name].append(statistics.median(times[args.drop :]))

    base = statistics.median(medians["none"])
    print(
        f"device={args.device} rounds={args.rounds} steps/block={args.steps} "
        f"baseline median step {base * 1000:.2f} ms"
    )
    print(f"{'observer':16} {'median step ms':>15} {'ratio vs none':>14} {'per-round ratios (min-max)':>28}")
    result: dict[str, Any] = {"device": args.device, "baseline_step_ms": base * 1000, "modes": {}}
    for name, values in medians.items():
        ratios = [v / b for v, b in zip(values, medians["none"], strict=True)]
        median_ratio = statistics.median(ratios)
        print(
            f"{name:16} {statistics.median(values) * 1000:15.2f} {median_ratio:14.4f} "
            f"{min(ratios):13.4f} - {max(ratios):.4f}"
        )
        result["modes"][name] = {
            "median_step_ms": statistics.median(values) * 1000,
            "ratio": median_ratio,
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        }
    c = WATCH_COST
    plain_steps = max(c["steps"] - c["windows"], 1)
    per_poll = c["poll_s"] / plain_steps
    per_window = c["window_s"] / max(c["windows"], 1)
    for window in (args.watch_window, 200):
        share = (per_poll + per_window / window) / base
        print(
            f"whole-run bookkeeping, measured in the step hook: {per_poll * 1e6:.0f} us a step + "
            f"{per_window * 1000:.1f} ms a window; windows of {window}: {share:.3%} of the median step"
        )
        result[f"watch_bookkeeping_share_window_{window}"] = share
    if args.own_batches:
        cost = forward_hook_cost(args.batch)
        print(
            f"the probe's work at each outermost forward: {cost * 1e6:.1f} us ({cost / base:.3%} of the step)"
        )
        result["forward_hook_us"] = cost * 1e6
    result["watch_poll_us"] = per_poll * 1e6
    result["watch_window_ms"] = per_window * 1000
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
