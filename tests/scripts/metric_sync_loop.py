"""A two-rank DDP fine-tune (torchrun, gloo, CPU) that all-reduces its logged metrics across the ranks and
reads each back with ``.item()``: every step by default, as training loops copied from examples do.

--metrics K    how many metrics are reduced (loss, tokens, accuracy, ...: one all-reduce each)
--every N      reduce them only every N steps (the fix: each rank sums its metrics every step, and the sums
               are reduced and logged every N steps)
--losses PATH  each rank appends "step loss" lines to PATH.rank<R> (its own loss, before any reduce)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).parent))
from common import TokenDataset, examples, packed_collate, packed_rows, tiny_llama

NAMES = ("loss", "tokens", "accuracy", "grad_norm", "lr", "label_tokens", "max_logit", "entropy")


def metrics_of(
    loss: torch.Tensor, logits: torch.Tensor, batch: dict[str, torch.Tensor], k: int
) -> list[torch.Tensor]:
    """The step's metrics on this rank, as one-element tensors (what a loop would log)."""
    with torch.no_grad():
        labels = batch["labels"][:, 1:]
        pred = logits[:, :-1].argmax(-1)
        seen = labels != -100
        probs = logits[:, -1].float().softmax(-1)
        values = [
            loss.detach(),
            torch.tensor(float(batch["input_ids"].numel())),
            (pred == labels)[seen].float().mean(),
            torch.tensor(0.0),  # filled with the gradient norm below
            torch.tensor(1e-3),
            seen.sum().float(),
            logits.detach().max(),
            -(probs * probs.clamp_min(1e-9).log()).sum(-1).mean(),
        ]
    return [v.reshape(1).clone() for v in (values * (k // len(values) + 1))[:k]]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--metrics", type=int, default=8)
    p.add_argument("--every", type=int, default=1)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--losses", type=Path, default=None)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dataset = TokenDataset(packed_rows(examples(512, 0), 128))  # type: ignore[arg-type,unused-ignore]
    loader = DataLoader(
        dataset, batch_size=args.batch, sampler=DistributedSampler(dataset, seed=0), collate_fn=packed_collate
    )
    model = torch.nn.parallel.DistributedDataParallel(tiny_llama("sdpa", max_len=128))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = None if args.losses is None else open(f"{args.losses}.rank{rank}", "a")  # noqa: SIM115
    step = epoch = 0
    running: list[torch.Tensor] | None = None
    while step < args.steps:
        loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        for batch in loader:
            result = model(**batch)
            result.loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if out is not None:
                out.write(f"{step} {result.loss.item().hex()}\n")
                out.flush()
            values = metrics_of(result.loss, result.logits, batch, args.metrics)
            values[min(3, len(values) - 1)] = norm.detach().reshape(1).clone()
            running = values if running is None else [r + v for r, v in zip(running, values, strict=True)]
            if step % args.every == 0:  # the metrics, averaged over the ranks and the steps, for the log
                logged = {}
                for i, value in enumerate(running):
                    dist.all_reduce(value)
                    logged[NAMES[i % len(NAMES)]] = value.item() / (world * args.every)
                running = None
                if rank == 0 and step % 50 == 0:
                    print(f"step {step}: {logged}", flush=True)
            if step >= args.steps:
                break
        epoch += 1
    dist.destroy_process_group()
    print(f"rank {rank} of {world} done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
