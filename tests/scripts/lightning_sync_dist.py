"""A Lightning DDP fine-tune for torchrun (two CPU ranks, gloo) that logs its step metrics with
``self.log(..., sync_dist=True)``: Lightning then all-reduces each logged value across the ranks as it is
logged, every step.

--metrics K     how many values training_step logs (the loss, then derived ones)
--no-sync       log them without sync_dist (each rank's own value): the fix
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from common import TokenDataset, examples, pad_collate, tiny_llama


class Module(L.LightningModule):
    def __init__(self, metrics: int, sync: bool) -> None:
        super().__init__()
        self.model = tiny_llama("sdpa", max_len=128)
        self.metrics = metrics
        self.sync = sync

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.model(**batch).loss
        for k in range(self.metrics):
            self.log(f"train/m{k}", loss.detach() * (k + 1), on_step=True, sync_dist=self.sync)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--metrics", type=int, default=4)
    p.add_argument("--no-sync", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    loader = DataLoader(TokenDataset(examples(2048, 0, hi=100)), batch_size=4, collate_fn=pad_collate(None))
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(
            max_steps=args.steps,
            accelerator="cpu",
            devices=2,
            strategy="ddp",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=root,
        )
        trainer.fit(Module(args.metrics, not args.no_sync), loader)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
