"""A 2-rank gloo DDP job on CPU that records the NCCL_* variables its processes saw (slow_links' runner test):
pitstop must not ask NCCL to log anything on a machine without GPUs, and gloo reads none of them anyway.

usage: torchrun --nproc_per_node 2 links_env.py OUT_PREFIX   (each rank writes OUT_PREFIX.rank<R>.json)
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    seen = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    with open(f"{sys.argv[1]}.rank{rank}.json", "w") as f:
        json.dump(seen, f)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(30):
        x = torch.randn(64, 256)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
