"""Two CPU ranks (gloo) started by torchrun outside pitstop, with a planted straggler: rank 1's examples
are slow to read (a sleep in ``__getitem__``, num_workers=0), so rank 0 waits for it inside the gradient
all_reduce of every step. Tests attach to the torchrun launcher's PID.

torchrun --nproc-per-node 2 two_ranks.py --seconds 30
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Examples(Dataset):
    def __init__(self, n: int, sleep_s: float) -> None:
        self.n, self.sleep_s = n, sleep_s
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 64, generator=g), torch.randint(0, 4, (n,), generator=g)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sleep_s:
            time.sleep(self.sleep_s)  # the planted cause, on rank 1 only
        return self.x[i], self.y[i]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--sleep", type=float, default=0.002, help="rank 1's seconds per example")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Examples(2048, args.sleep if rank == 1 else 0.0)
    loader = DataLoader(data, batch_size=32, shuffle=True, num_workers=0)
    end = time.time() + args.seconds
    dist.barrier()
    step, going = 0, True
    while going:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
            opt.step()
            step += 1
            if step % 50 == 0 and rank == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            stop = torch.tensor([float(time.time() >= end)])
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # every rank stops at the same step
            if stop.item():
                going = False
                break
    dist.barrier()  # no rank tears gloo down while a peer still talks to it (its threads abort the process)
    dist.destroy_process_group()
    if rank == 0:
        print(f"done {step} steps (pid {os.getpid()})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
