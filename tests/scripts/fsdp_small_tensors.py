"""Plants sharding_overhead: a small model of many small tensors (a deep stack of LayerNorm + two small Linear
blocks, six parameter tensors each) trained on two gloo ranks (torchrun, CPU), sharded by FSDP with each block
its own unit, as the usual per-layer wrapping does. The whole model is a few MB: a full replica (DDP) fits any
device many times over, yet every step FSDP all-gathers each block for the forward and again for the
backward and reduce-scatters its gradients, one small collective per unit and pass, with its hooks' host work
around each, where DDP all-reduces the gradients in one 25 MB bucket.

--wrap fsdp2|fsdp1|ddp   FSDP2 ``fully_shard`` per block (and the root), FSDP1 ``FullyShardedDataParallel``
                         with a per-block wrap policy, or plain DistributedDataParallel (the fix, by hand)
--losses PATH            each rank appends "step loss" lines to PATH.rank<R>
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

VOCAB = 256


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, width)
        self.down = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Deep(torch.nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, width)
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(depth))
        self.head = torch.nn.Linear(width, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        logits = self.head(x[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), input_ids[:, 1:].reshape(-1))


def wrap(model: Deep, how: str) -> torch.nn.Module:
    if how == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if how == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        return FullyShardedDataParallel(
            model, device_id=torch.device("cpu"), auto_wrap_policy=ModuleWrapPolicy({Block})
        )
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--wrap", choices=("fsdp2", "fsdp1", "ddp"), default="fsdp2")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--depth", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--losses", type=Path, default=None)
    p.add_argument("--timing", action="store_true", help="print rank 0's mean step time after step 5")
    args = p.parse_args()
    warnings.filterwarnings("ignore")  # FSDP1's deprecation note
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = wrap(Deep(args.width, args.depth), args.wrap)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1000 + rank)
    out = None if args.losses is None else open(f"{args.losses}.rank{rank}", "a")  # noqa: SIM115
    started = 0.0
    for step in range(1, args.steps + 1):
        if step == 6:
            started = time.perf_counter()
        batch = torch.randint(0, VOCAB, (args.batch, args.seq), generator=gen)
        loss = model(batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if out is not None:  # each step as it ends: pitstop stops the job after its window
            out.write(f"{step} {loss.item().hex()}\n")
            out.flush()
    if args.timing and rank == 0 and args.steps > 5:
        print(f"{args.wrap} step_ms {(time.perf_counter() - started) / (args.steps - 5) * 1000:.2f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
