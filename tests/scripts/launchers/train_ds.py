"""A tiny job for DeepSpeed's launcher: ``deepspeed --num_accelerators 2 train_ds.py``. Each worker joins
gloo from the variables the launcher sets (RANK, WORLD_SIZE, MASTER_ADDR) and trains a small MLP on the CPU,
averaging gradients with all_reduce. ``deepspeed.init_distributed`` is left out: on a CPU it compiles a
shared-memory op first (minutes). Nothing here knows about pitstop: it reaches the workers only if the
launcher passes the environment on."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--local_rank", type=int, default=0)  # the launcher passes it
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        loss = (model(torch.randn(16, 32)) - 1.0).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
