"""A plain PyTorch loop on a tiny Llama that plants per_step_cleanup: ``gc.collect()`` (and
``torch.cuda.empty_cache()``, a no-op on a CPU) called at the end of every step, the memory-leak workaround
copied from a forum, while the job holds a big Python heap (a pretokenized dataset kept as Python lists, as
``gc_heavy.py`` does), so every full collection traverses ~0.9 M live objects (with the libraries'). ``--collect-every 0`` is the
negative control and the fixed job: no cleanup call at all."""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import tiny_llama


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--objects", type=int, default=500_000, help="tracked objects kept alive")
    p.add_argument("--collect-every", type=int, default=1, help="gc.collect() every N steps (0: never)")
    p.add_argument("--no-empty-cache", action="store_true", help="only gc.collect(), no empty_cache()")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--losses", type=Path, default=None, help="append the loss of every step here")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dataset = [[i % 500, 1, 2] for i in range(max(args.objects, 1))]  # token ids held as Python lists
    model = tiny_llama("sdpa", hidden=args.hidden, layers=args.layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    out = args.losses.open("w") if args.losses is not None else None
    for step in range(args.steps):
        rows = [dataset[(step * 8 + r) % len(dataset)][0] + 3 + c for r in range(8) for c in range(96)]
        batch = torch.tensor(rows).remainder(500).view(8, 96)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if out is not None:  # each step as it ends: pitstop doctor stops the job after its window
            print(repr(loss.item()), file=out, flush=True)
        if args.collect_every and step % args.collect_every == 0:
            gc.collect()  # "free the memory every step"
            if not args.no_empty_cache:
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
