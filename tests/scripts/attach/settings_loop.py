"""A plain CPU training loop started outside pitstop, with issue 40's settings and calls planted on request
(tests attach to it by PID): ``--collect`` calls ``gc.collect()`` after every step while the job keeps a
large heap of Python objects alive (a memory-leak workaround copied into a loop), ``--anomaly`` leaves
autograd's anomaly detection on, ``--find-unused`` wraps the model in DDP with ``find_unused_parameters=True``
though every parameter gets a gradient (run it under torchrun: gloo, one CPU thread a rank).

python settings_loop.py --seconds 30 --collect --anomaly
torchrun --nproc-per-node 2 settings_loop.py --seconds 30 --find-unused > train.log 2>&1
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import torch
from torch import nn


def _time_up(end: float, step: int, distributed: bool) -> bool:
    """The window is over; ranks agree on it every 20 steps (one stopping early would leave the other in its
    gradient all-reduce)."""
    if not distributed:
        return time.monotonic() >= end
    if step % 20:
        return False
    import torch.distributed as dist

    flag = torch.tensor([float(time.monotonic() >= end)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0, help="train for this long, then exit 0")
    ap.add_argument("--collect", action="store_true", help="gc.collect() after every step")
    ap.add_argument("--objects", type=int, default=60_000, help="Python objects kept alive (for --collect)")
    ap.add_argument("--anomaly", action="store_true", help="torch.autograd.set_detect_anomaly(True)")
    ap.add_argument("--find-unused", action="store_true", help="DDP(find_unused_parameters=True), gloo")
    ap.add_argument("--layers", type=int, default=24)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    kept = [[i, str(i)] for i in range(args.objects)] if args.collect else []  # a dataset held as lists
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    model: nn.Module = nn.Sequential(*layers, nn.Linear(64, 4))
    if args.find_unused:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        model = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    if args.anomaly:
        torch.autograd.set_detect_anomaly(True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 64), torch.randint(0, 4, (16,))
    step, end = 0, time.monotonic() + args.seconds
    print(f"ready {os.getpid()} {len(kept)}", flush=True)
    while not _time_up(end, step, args.find_unused):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.collect:
            gc.collect()  # the planted call: a full collection every step
        step += 1
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    print(f"done {step} steps", flush=True)
    if args.find_unused:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
