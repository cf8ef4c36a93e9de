"""A plain PyTorch loop that plants the CPU-side causes: checkpoints saved every few steps
(``--save-every``), more torch threads than cores (``--threads``) beside DataLoader workers (``--workers``)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from common import TokenDataset, examples, packed_collate, packed_rows, pad_collate, tiny_llama


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument(
        "--save-every", type=int, default=0, help="save_pretrained + optimizer state every N steps"
    )
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads(N) before training")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--short", action="store_true", help="one short example per row, not packed rows")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    loader = DataLoader(
        TokenDataset(examples(512, 0, 16, 32) if args.short else packed_rows(examples(512, 0), 256)),  # type: ignore[arg-type]
        batch_size=args.batch,
        shuffle=True,
        collate_fn=pad_collate(None) if args.short else packed_collate,
        num_workers=args.workers,
        generator=torch.Generator().manual_seed(0),
    )
    model = tiny_llama("sdpa", hidden=args.hidden)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = Path(tempfile.mkdtemp(prefix="pitstop-ckpt-"))
    step = 0
    while step < args.steps:
        for batch in loader:
            model(**batch).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if args.save_every and step % args.save_every == 0:  # as a Trainer does: model, then optimizer
                model.save_pretrained(out / "checkpoint")
                torch.save(opt.state_dict(), out / "checkpoint" / "optimizer.pt")
            if step >= args.steps:
                break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
