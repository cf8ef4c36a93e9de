"""A plain PyTorch loop that plants gc_pauses: millions of tracked Python objects kept alive (a "tokenized
dataset" held as Python lists) and, every step, Python objects that live across the step and then become
cyclic garbage (per-example records that point at each other), so full collections traverse the whole heap
inside the window. ``--manual-gc`` applies the fix pitstop advises (``gc.freeze()`` after setup,
``gc.disable()``, a full ``gc.collect()`` every few steps, which skips the frozen objects); ``--freeze`` only
freezes."""

from __future__ import annotations

import argparse
import gc
from pathlib import Path

import torch


def records(step: int, count: int) -> list[list[object]]:
    """Per-example bookkeeping: each record refers to itself, so only the collector frees it."""
    made: list[list[object]] = []
    for i in range(count):
        record: list[object] = [step, i]
        record.append(record)
        made.append(record)
    return made


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--objects", type=int, default=3_000_000, help="tracked objects kept alive")
    p.add_argument("--per-step", type=int, default=200_000, help="records made every step")
    p.add_argument("--manual-gc", action="store_true", help="freeze, disable, gc.collect() every 5 steps")
    p.add_argument("--freeze", action="store_true", help="gc.freeze() after building the objects")
    p.add_argument("--losses", type=Path, default=None, help="append the loss of every step here, one a line")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dataset = [[i % 50_000, 1, 2] for i in range(args.objects)]  # token ids as Python lists
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.manual_gc or args.freeze:
        gc.collect()
        gc.freeze()
    if args.manual_gc:
        gc.disable()
    out = args.losses.open("w") if args.losses is not None else None
    recent: list[list[list[object]]] = []
    for step in range(args.steps):
        x = torch.tensor([row[0] for row in dataset[step * 16 : step * 16 + 16]], dtype=torch.float32)
        x = (x / 50_000).unsqueeze(1).expand(16, 64)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if out is not None:  # each step as it ends: pitstop doctor stops the job after its window
            print(repr(loss.item()), file=out, flush=True)
        recent = [*recent[-1:], records(step, args.per_step)]  # kept one step, then cyclic garbage
        if args.manual_gc and step % 5 == 0:
            gc.collect()  # full, but the frozen dataset is not traversed
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
