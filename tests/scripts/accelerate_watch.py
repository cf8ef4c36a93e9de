"""A plain Accelerate training loop that logs to TensorBoard through ``accelerator.init_trackers`` and runs
under ``pitstop.watch(mode="watch")`` (pitstop's windows must land in the job's own TensorBoard run)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from common import TokenDataset, examples, pad_collate, tiny_llama

import pitstop


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--project-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, log_with="tensorboard", project_dir=str(args.project_dir))
    accelerator.init_trackers("job")
    model = tiny_llama("sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(TokenDataset(examples(512, 0)), batch_size=4, collate_fn=pad_collate(None))
    model, opt, loader = accelerator.prepare(model, opt, loader)
    with pitstop.watch(mode="watch", warmup=2, window_steps=10, report=False) as session:
        for step, batch in enumerate(loader, start=1):
            loss = model(**batch).loss
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            accelerator.log({"loss": float(loss.detach())}, step=step)
            if step >= args.steps:
                break
    accelerator.end_training()
    assert session.watch_report is not None and session.diagnosis is not None
    print(f"windows={len(session.watch_report.windows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
