"""A plain PyTorch fine-tuning loop with switchable planted causes (for pitstop's integration tests)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from common import TokenDataset, examples, packed_collate, packed_rows, pad_collate, tiny_llama


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--attn", default="sdpa")
    p.add_argument("--pad-to", type=int, default=None, help="pad every row to this length")
    p.add_argument("--slow-ms", type=float, default=0.0, help="blocking read per example")
    p.add_argument("--packed", action="store_true")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--losses", type=Path, default=None, help="write the loss of every step here")
    p.add_argument("--watch", type=Path, default=None, help="use pitstop.watch(), writing its JSON here")
    p.add_argument("--crash-before-step", action="store_true")
    p.add_argument("--no-optimizer", action="store_true")
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--spawn", action="store_true", help="start DataLoader workers with spawn, not fork")
    # planted late events (pitstop watch's tests)
    p.add_argument("--slow-after", type=int, default=None, help="from this step on, reads are slow")
    p.add_argument("--slow-after-ms", type=float, default=4.0, help="per example, after --slow-after")
    p.add_argument("--eval-every", type=int, default=None, help="an evaluation (a sleep) every M steps")
    p.add_argument("--eval-s", type=float, default=0.5)
    p.add_argument("--save-every", type=int, default=None, help="a checkpoint save every K steps")
    p.add_argument("--save-s", type=float, default=0.3, help="extra seconds of a save (slow storage)")
    p.add_argument("--save-dir", type=Path, default=None)
    p.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (1: steadier on a busy machine)"
    )
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.spawn:
        torch.multiprocessing.set_start_method("spawn", force=True)

    torch.manual_seed(args.seed)
    data = examples(512, args.seed)
    if args.packed:
        dataset = TokenDataset(packed_rows(data, 256), args.slow_ms)  # type: ignore[arg-type]
        collate = packed_collate
    else:
        dataset = TokenDataset(data, args.slow_ms)
        collate = pad_collate(args.pad_to)
    loader = DataLoader(
        dataset,
        batch_size=args.batch,
        shuffle=True,
        collate_fn=collate,
        num_workers=args.workers,
        generator=torch.Generator().manual_seed(args.seed),
    )
    model = tiny_llama(args.attn)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if args.crash_before_step:
        raise RuntimeError("planted crash before the first step")

    losses: list[float] = []

    def late_events(step: int) -> None:
        """What a long run does between steps, planted at known steps."""
        if args.slow_after is not None and step == args.slow_after:
            dataset.slow_ms = args.slow_after_ms  # the DataLoader turns slow (cold page cache, a new shard)
        if args.eval_every and step % args.eval_every == 0:
            with torch.no_grad():
                model(**next(iter(loader)))
            time.sleep(args.eval_s)
        if args.save_every and step % args.save_every == 0:
            folder = args.save_dir or Path(tempfile.gettempdir())
            torch.save(model.state_dict(), folder / f"plain-loop-{os.getpid()}.pt")
            time.sleep(args.save_s)

    def train() -> None:
        step = 0
        while step < args.steps:
            for batch in loader:
                loss = model(**batch).loss
                if args.no_optimizer:
                    losses.append(float(loss.detach()))
                    step += 1
                    break
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(float(loss.detach()))
                step += 1
                late_events(step)
                if step >= args.steps:
                    break

    if args.watch:
        import pitstop

        with pitstop.watch(steps=args.steps - 3, warmup=3, json_path=args.watch):
            train()
    else:
        train()
    if args.losses:
        args.losses.write_text(json.dumps(losses))
    return args.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
