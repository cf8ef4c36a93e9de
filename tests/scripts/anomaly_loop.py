"""A plain PyTorch loop on a tiny Llama that plants debug_modes: autograd's anomaly detection left on, switched
on once before the loop (``--anomaly global``, the common copy-paste) or entered around every step
(``--anomaly per-step``). Its cost is per autograd operation, so a small model with many operations pays it
fully (about 2× the step on a CPU)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import tiny_llama


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--anomaly", choices=("off", "global", "per-step"), default="global")
    p.add_argument("--losses", type=Path, default=None, help="append the loss of every step here")
    args = p.parse_args()
    warnings.filterwarnings("ignore", "Anomaly Detection has been enabled")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.anomaly == "global":
        torch.autograd.set_detect_anomaly(True)
    model = tiny_llama("sdpa", layers=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(3, 500, (4, 64))
    out = args.losses.open("w") if args.losses is not None else None
    for _ in range(args.steps):
        around = torch.autograd.detect_anomaly() if args.anomaly == "per-step" else contextlib.nullcontext()
        with around:
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if out is not None:  # each step as it ends: pitstop doctor stops the job after its window
            print(repr(loss.item()), file=out, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
