"""A DistributedDataParallel fine-tune for torchrun (gloo, CPU); one rank can be given a slow input pipeline."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).parent))
from common import TokenDataset, examples, packed_collate, packed_rows, tiny_llama


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--slow-rank", type=int, default=None)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument(
        "--slow-after", type=int, default=None, help="the slow rank turns slow only after this step"
    )
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = packed_rows(examples(512, 0), 256)
    slow = args.slow_ms if rank == args.slow_rank else 0.0
    dataset = TokenDataset(rows, 0.0 if args.slow_after is not None else slow)  # type: ignore[arg-type]
    loader = DataLoader(
        dataset, batch_size=4, sampler=DistributedSampler(dataset, seed=0), collate_fn=packed_collate
    )
    model = torch.nn.parallel.DistributedDataParallel(tiny_llama("sdpa"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    epoch = 0
    while step < args.steps:
        loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step == args.slow_after:
                dataset.slow_ms = slow  # late: a rank whose storage degrades overnight
            if step >= args.steps:
                break
        epoch += 1
    dist.destroy_process_group()
    print(f"rank {rank} of {os.environ.get('WORLD_SIZE')} done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
