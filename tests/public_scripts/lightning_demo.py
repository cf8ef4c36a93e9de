"""Train Lightning's own demo language model (``lightning.pytorch.demos.LightningTransformer`` on its
``WikiText2`` dataset and ``train_dataloader``), used the way Lightning's documentation shows it; nothing of
the demo is copied. Run in a folder whose ``data/wikitext-2.txt`` holds local text.

``python -m tests.public_scripts.lightning_demo STEPS LOSSES.json``: writes the loss of every step (the
value ``training_step`` returned) with full precision, since the demo logs none itself."""

from __future__ import annotations

import json
import sys
from typing import Any


def main() -> None:
    import lightning as L
    from lightning.pytorch.demos import LightningTransformer, WikiText2

    steps, out = int(sys.argv[1]), sys.argv[2]
    losses: list[float] = []

    class RecordLoss(L.Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, idx: int) -> None:
            losses.append(float(outputs["loss"]))

    L.seed_everything(0)
    dataset = WikiText2()  # ./data/wikitext-2.txt
    model = LightningTransformer(vocab_size=dataset.vocab_size)
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[RecordLoss()],
    )
    trainer.fit(model)
    with open(out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
