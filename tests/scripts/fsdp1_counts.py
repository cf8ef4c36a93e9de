"""Two gloo ranks train an FSDP1-wrapped model one step; rank 0 prints what the probe counts of it (JSON)."""

from __future__ import annotations

import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import FullyShardedDataParallel

from pitstop.probe import environment as envmod


def rank_main(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    results = []
    for use_orig in (False, True):
        torch.manual_seed(0)
        plain = torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Linear(8, 8))
        model = FullyShardedDataParallel(plain, device_id=torch.device("cpu"), use_orig_params=use_orig)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.tensor([[1, 2]])).sum().backward()
        opt.step()
        info = envmod.model_info(model, opt)
        local = sum(p.numel() for p in model.parameters())
        results.append([info.params_total, info.params_trainable, info.params_embedding, local])
    if rank == 0:
        print(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.spawn(rank_main, args=(free,), nprocs=2)
