"""A Lightning fine-tune of the tiny Llama with padded batches, observed through pitstop's Lightning callback."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from common import TokenDataset, examples, pad_collate, tiny_llama

from pitstop.integrations.lightning import PitstopCallback


class Module(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = tiny_llama("sdpa")

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.model(**batch).loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> int:
    out = Path(sys.argv[1])
    torch.manual_seed(0)
    loader = DataLoader(TokenDataset(examples(256, 0)), batch_size=8, collate_fn=pad_collate(256))
    callback = PitstopCallback(steps=10, warmup=3, json_path=out)
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(
            max_steps=16,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=root,
            callbacks=[callback],
        )
        trainer.fit(Module(), loader)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
