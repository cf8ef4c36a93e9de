"""A Hugging Face Trainer fine-tune that plants per_step_cleanup the way users write it: a ``TrainerCallback``
whose ``on_step_end`` calls ``gc.collect()`` and ``torch.cuda.empty_cache()`` after every optimizer step (a
memory-leak workaround), while the job keeps a big Python heap (per-example metadata held as Python objects
beside the tokenized dataset), so every full collection traverses ~1 M live objects.
``--no-callback`` is the negative control; ``--empty-cache-steps N`` sets the Trainer's own
``torch_empty_cache_steps`` (which on a CPU run calls nothing: the Trainer empties only an accelerator's
cache)."""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import TokenDataset, examples, pad_collate, tiny_llama


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--objects", type=int, default=500_000, help="metadata objects kept alive")
    p.add_argument("--no-callback", action="store_true", help="no cleanup callback (the control)")
    p.add_argument(
        "--empty-cache-steps", type=int, default=None, help="TrainingArguments(torch_empty_cache_steps)"
    )
    args = p.parse_args()

    from transformers import Trainer, TrainerCallback, TrainingArguments

    class FreeMemory(TrainerCallback):
        """The workaround copied from a forum thread: "free the memory after every step"."""

        def on_step_end(self, targs: Any, state: Any, control: Any, **kwargs: Any) -> None:
            gc.collect()
            torch.cuda.empty_cache()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = examples(512, 0)
    metadata = [{"source": i % 7, "tokens": [i, i + 1]} for i in range(args.objects // 2)]  # kept alive
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(
            model=tiny_llama("sdpa", hidden=args.hidden, layers=args.layers),
            args=TrainingArguments(
                output_dir=out,
                per_device_train_batch_size=args.batch,
                max_steps=args.steps,
                learning_rate=1e-3,
                logging_steps=1000,
                save_strategy="no",
                report_to=[],
                use_cpu=True,
                dataloader_num_workers=0,
                remove_unused_columns=False,
                torch_empty_cache_steps=args.empty_cache_steps,
            ),
            train_dataset=TokenDataset(data),
            data_collator=pad_collate(None),
            callbacks=[] if args.no_callback else [FreeMemory()],
        )
        trainer.train()
    del metadata
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
