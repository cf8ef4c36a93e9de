"""A DDP fine-tune for torchrun (gloo, CPU) with one planted multi-rank cause.

--slow-compute-rank R --slow-compute-ms M   rank R's forward takes M ms longer (a sleep inside the model's
                                            forward: its compute, not its data, is slow)
--heavy                                     a model with large gradients and almost no compute per step
                                            (communication dominates)
--die-rank R --die-step S                   rank R's process vanishes at step S (a lost node)
--losses PATH                               each rank appends "step loss" lines to PATH.rank<R>
--from-slurm                                rank and world size from SLURM_PROCID / SLURM_NTASKS, as a script
                                            started once per rank by `srun` may take them
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).parent))
from common import TokenDataset, examples, packed_collate, packed_rows, tiny_llama


class Heavy(torch.nn.Module):
    """Millions of parameters, but each step touches them with one tiny matmul: gradients are large,
    compute is small."""

    def __init__(self, width: int = 2048, depth: int = 6) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width, bias=False) for _ in range(depth))
        self.width = width

    def forward(self, input_ids: torch.Tensor, **_: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.one_hot(input_ids[:, :1] % self.width, self.width).float().squeeze(1)
        for layer in self.layers:
            x = layer(x)
        return x.pow(2).mean()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--slow-compute-rank", type=int, default=None)
    p.add_argument("--slow-compute-ms", type=float, default=0.0)
    p.add_argument("--heavy", action="store_true")
    p.add_argument("--losses", type=Path, default=None)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--die-rank", type=int, default=None, help="this rank's process dies at --die-step")
    p.add_argument("--die-step", type=int, default=0)
    p.add_argument("--from-slurm", action="store_true", help="rank and size from Slurm's variables")
    args = p.parse_args()

    if args.from_slurm:  # the address still comes from MASTER_ADDR / MASTER_PORT
        rank, size = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
        dist.init_process_group("gloo", rank=rank, world_size=size)
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = packed_rows(examples(512, 0), 128)
    dataset = TokenDataset(rows)  # type: ignore[arg-type]
    loader = DataLoader(
        dataset, batch_size=args.batch, sampler=DistributedSampler(dataset, seed=0), collate_fn=packed_collate
    )
    inner = Heavy() if args.heavy else tiny_llama("sdpa", max_len=128)
    if rank == args.slow_compute_rank and args.slow_compute_ms:
        delay = args.slow_compute_ms / 1000.0
        inner.register_forward_pre_hook(lambda *_: time.sleep(delay))
    # --heavy: one bucket for all gradients, so the whole all-reduce comes after the backward and none of it
    # hides behind compute (communication dominates by far, even where a busy machine slows one rank)
    model = torch.nn.parallel.DistributedDataParallel(inner, bucket_cap_mb=1024 if args.heavy else 25)
    params = model.parameters()
    opt = torch.optim.SGD(params, lr=1e-3) if args.heavy else torch.optim.AdamW(params, lr=1e-3)
    out = None if args.losses is None else open(f"{args.losses}.rank{rank}", "a")  # noqa: SIM115
    step = 0
    epoch = 0
    while step < args.steps:
        loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        for batch in loader:
            result = model(**batch)
            loss = result if isinstance(result, torch.Tensor) else result.loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if rank == args.die_rank and step == args.die_step:
                os._exit(1)  # a node lost mid-window: no exit handlers, no goodbye
            if out is not None:
                out.write(f"{step} {loss.item().hex()}\n")
                out.flush()
            if step >= args.steps:
                break
        epoch += 1
    world = dist.get_world_size()
    dist.destroy_process_group()
    print(f"rank {rank} of {world} done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
