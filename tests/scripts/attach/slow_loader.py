"""A plain CPU training loop with a planted slow input pipeline, started outside pitstop (tests attach to
it by PID). ``__getitem__`` sleeps, and num_workers=0 keeps the wait in the main process, so a sampled view
sees the main thread inside ``DataLoader.__next__`` for most of each step.

python slow_loader.py --seconds 20 --sleep 0.001 [--steps-file F]  (prints one loss line per 20 steps)
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset):
    def __init__(self, n: int, sleep_s: float) -> None:
        self.n, self.sleep_s = n, sleep_s
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 64, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sleep_s:
            time.sleep(self.sleep_s)  # the planted cause: a slow example read
        return self.x[i], self.y[i]


def save(model: nn.Module, opt: torch.optim.Optimizer, args: argparse.Namespace, step: int) -> None:
    """The planted checkpoint stall: the loop waits for a torch.save of the model, the optimizer and
    ``--save-mb`` of extra state (one file, overwritten)."""
    import os
    import tempfile

    folder = args.save_dir or tempfile.gettempdir()
    extra = torch.zeros(args.save_mb * 2**18)  # float32: 4 bytes each
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "extra": extra, "step": step}
    torch.save(state, os.path.join(folder, f"pitstop-attach-ckpt-{os.getpid()}.pt"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0, help="train for this long, then exit 0")
    ap.add_argument("--sleep", type=float, default=0.001, help="seconds per example in __getitem__")
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument(
        "--save-every", type=int, default=0, help="torch.save a checkpoint every N steps (0: never)"
    )
    ap.add_argument("--save-mb", type=int, default=64, help="the checkpoint's extra state, in MB")
    ap.add_argument("--save-dir", default=None, help="where checkpoints go (default: a temporary folder)")
    ap.add_argument("--step-times", default=None, help="write each step's wall time here, one a line")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(
        nn.Linear(64, args.width),
        nn.ReLU(),
        nn.Linear(args.width, args.width),
        nn.ReLU(),
        nn.Linear(args.width, 4),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowDataset(4096, args.sleep), batch_size=args.batch, shuffle=True, num_workers=0)
    # (wall clock at the step's end, seconds since the last step's end, CPU seconds of the process in them)
    times: list[tuple[float, float, float]] = []
    step, end = 0, time.monotonic() + args.seconds
    print("ready", flush=True)
    while time.monotonic() < end:
        last, last_cpu = time.perf_counter(), time.process_time()
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if args.save_every and step % args.save_every == 0:
                save(model, opt, args, step)
            now, cpu = time.perf_counter(), time.process_time()
            times.append((time.time(), now - last, cpu - last_cpu))  # the whole step: batch wait included
            last, last_cpu = now, cpu
            if step % 20 == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            if time.monotonic() >= end:
                break
    if args.step_times:
        with open(args.step_times, "w") as f:
            f.write("\n".join(f"{t:.6f} {dt:.6f} {c:.6f}" for t, dt, c in times))
    print(f"done {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
