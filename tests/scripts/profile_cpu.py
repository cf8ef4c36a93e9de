"""Record a torch.profiler (Kineto) trace of a tiny CPU fine-tune with one planted cause."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from common import TokenDataset, examples, pad_collate, tiny_llama


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--slow-ms", type=float, default=0.0, help="slow preprocessing per example")
    p.add_argument("--item", action="store_true", help="read the loss with .item() every step")
    p.add_argument("--pad-to", type=int, default=None)
    args = p.parse_args()

    torch.manual_seed(0)
    data = TokenDataset(examples(256, 0), args.slow_ms)
    loader = DataLoader(data, batch_size=8, collate_fn=pad_collate(args.pad_to), num_workers=0)
    model = tiny_llama("sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = schedule(wait=1, warmup=1, active=4, repeat=1)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=sched,
        record_shapes=True,
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(args.out)),
    ) as prof:
        for step, batch in enumerate(loader):
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if args.item:
                print(f"loss {loss.item():.3f}", file=sys.stderr)
            prof.step()
            if step >= 7:
                break
    time.sleep(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
