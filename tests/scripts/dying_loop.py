"""A plain pretraining-style loop (full-length blocks, no attention mask, ``model(input_ids=x, labels=x)``) that
can die by a signal after some steps, or ignore the signals that ask it to stop (pitstop's runner tests)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).parent))
from common import VOCAB, tiny_llama


class Blocks(Dataset[torch.Tensor]):
    """Fixed-length blocks of token ids, as a pretraining loop reads them (no padding, no mask)."""

    def __init__(self, n: int, length: int, seed: int) -> None:
        self.data = torch.randint(3, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--die-by", default=None, help="a signal name (SIGKILL, SIGSEGV, SIGTERM) sent to itself")
    p.add_argument("--after", type=int, default=10, help="optimizer steps before dying")
    p.add_argument("--ignore-stop", action="store_true", help="ignore SIGINT and SIGTERM")
    p.add_argument("--pad-id", action="store_true", help="keep the model's pad token id (default: none)")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step")
    p.add_argument("--marker", default="", help="ignored; lets a test find this process")
    args = p.parse_args()
    if args.ignore_stop:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    torch.manual_seed(0)
    model = tiny_llama("sdpa", max_len=64)
    if not args.pad_id:
        model.config.pad_token_id = None  # as GPT-2 and many base models: no pad token at all
    loader = DataLoader(Blocks(256, 64, 0), batch_size=4, shuffle=True, num_workers=args.workers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    while step < args.steps:
        for x in loader:
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if args.die_by and step == args.after:
                os.kill(os.getpid(), getattr(signal, args.die_by))
                time.sleep(5)  # a signal that is caught or ignored must not let the loop go on unnoticed
            if step >= args.steps:
                break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
