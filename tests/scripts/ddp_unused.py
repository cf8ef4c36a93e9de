"""A two-rank DDP fine-tune for torchrun (gloo, CPU) that plants ddp_find_unused: the model is wrapped with
``find_unused_parameters=True`` while every parameter gets a gradient, so each step DDP walks the whole autograd
graph from the outputs for nothing. The search costs per autograd node, so the planted model is a deep stack of
small blocks (many nodes, little compute each).

--find-unused on|off     what the job passes to DistributedDataParallel (off: the fix, by hand)
--unused all|rank1       the model holds a spare head that no step uses (all), or that only rank 0 uses (rank1:
                         rank 1 leaves it without a gradient); either way the search is needed
--via ddp|accelerate     who builds the wrapper: the job's own DDP(...) line, or Accelerate's prepare() with
                         DistributedDataParallelKwargs(find_unused_parameters=...)
--losses PATH            each rank appends "step loss" lines to PATH.rank<R>
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

VOCAB = 512


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Deep(torch.nn.Module):
    """Many small blocks over embedded token ids: ~10 autograd nodes per block, a small matmul each."""

    def __init__(self, width: int, depth: int, spare: bool, spare_used: bool) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, width)
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(depth))
        self.head = torch.nn.Linear(width, VOCAB)
        # a head kept for another task: trainable, used by this rank's forward or not
        self.spare = torch.nn.Linear(width, 2) if spare else None
        self.spare_used = spare_used

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        logits = self.head(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), input_ids[:, 1:].reshape(-1))
        if self.spare is not None and self.spare_used:
            loss = loss + 0.01 * self.spare(x).pow(2).mean()
        return loss


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--find-unused", choices=("on", "off"), default="on")
    p.add_argument("--unused", choices=("all", "rank1"), default=None)
    p.add_argument("--via", choices=("ddp", "accelerate"), default="ddp")
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--depth", type=int, default=96)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--losses", type=Path, default=None)
    args = p.parse_args()
    find_unused = args.find_unused == "on"

    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank_env = int(os.environ.get("RANK", "0"))
    inner = Deep(args.width, args.depth, args.unused is not None, args.unused == "rank1" and rank_env != 1)
    ids = torch.randint(0, VOCAB, (4096, args.seq), generator=torch.Generator().manual_seed(0))
    data = TensorDataset(ids)
    if args.via == "accelerate":
        from accelerate import Accelerator, DistributedDataParallelKwargs

        accelerator = Accelerator(
            cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=find_unused)]
        )
        loader = DataLoader(data, batch_size=args.batch, shuffle=False)
        opt = torch.optim.AdamW(inner.parameters(), lr=1e-3)
        model, opt, loader = accelerator.prepare(inner, opt, loader)
        rank = accelerator.process_index
        backward = accelerator.backward
    else:
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        loader = DataLoader(data, batch_size=args.batch, sampler=DistributedSampler(data, seed=0))
        model = torch.nn.parallel.DistributedDataParallel(inner, find_unused_parameters=find_unused)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def backward(loss: torch.Tensor) -> None:
            loss.backward()

    out = None if args.losses is None else open(f"{args.losses}.rank{rank}", "a")  # noqa: SIM115
    step = epoch = 0
    while step < args.steps:
        sampler = getattr(loader, "sampler", None)
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)
        for (batch,) in loader:
            loss = model(batch)
            backward(loss)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if out is not None:  # each step as it ends: pitstop stops the job after its window
                out.write(f"{step} {loss.item().hex()}\n")
                out.flush()
            if step >= args.steps:
                break
        epoch += 1
    if dist.is_initialized():
        dist.destroy_process_group()
    print(f"rank {rank} of {os.environ.get('WORLD_SIZE')} done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
