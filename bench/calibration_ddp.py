"""A two-rank DDP job (torchrun, gloo, CPU) with one planted multi-rank cause, for ``bench/calibration.py``:

--slow-rank R --slow-ms M   rank R's forward takes M ms longer (a sleep in its forward: a straggler waiting
                            on its storage or host); the fix, applied by hand, is the same job without the delay
--busy                      the delay computes instead of sleeping (matmuls for M ms: a straggler with more
                            work, or a slower device, which leaves no core to the other ranks)
--accum K                   K micro-batches per optimizer step, each all-reducing every gradient (no ``no_sync``):
                            communication-heavy; ``--no-sync`` is the fix (all-reduce on the last micro-batch only)

The model is a stack of wide linear layers over embedded token ids: large gradients (one 4 MB bucket per
layer), a moderate matmul per micro-batch. Batches are token ids from a DataLoader, so tokens/s is counted."""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

VOCAB = 1024


class Wide(torch.nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, width)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width, bias=False) for _ in range(depth))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x.pow(2).mean()


def busy(seconds: float) -> None:
    """Compute (matmuls on a private tensor) for ``seconds``: extra work on this rank, nothing the model sees."""
    a = torch.ones(128, 128)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        torch.mm(a, a)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--batch", type=int, default=4, help="rows per micro-batch")
    p.add_argument("--seq", type=int, default=32, help="tokens per row")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--no-sync", action="store_true", help="all-reduce on the last micro-batch only")
    p.add_argument("--slow-rank", type=int, default=None)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--busy", action="store_true", help="the delay computes rather than sleeps")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (4096, args.seq))
    data = TensorDataset(ids)
    loader = DataLoader(data, batch_size=args.batch, sampler=DistributedSampler(data, seed=0))
    inner = Wide(args.width, args.depth)
    if rank == args.slow_rank and args.slow_ms:
        delay = args.slow_ms / 1000.0
        inner.register_forward_pre_hook(lambda *_: (busy if args.busy else time.sleep)(delay))
    model = torch.nn.parallel.DistributedDataParallel(inner, bucket_cap_mb=4)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    step = micro = epoch = 0
    while step < args.steps:
        loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        for (batch,) in loader:
            micro += 1
            last = micro % args.accum == 0
            quiet = model.no_sync() if args.no_sync and not last else contextlib.nullcontext()
            with quiet:
                (model(batch) / args.accum).backward()
            if last:
                opt.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                if step >= args.steps:
                    break
        epoch += 1
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
