"""A Hugging Face Trainer fine-tune for torchrun (two CPU ranks, gloo) that counts the input tokens it has seen
(``include_num_input_tokens_seen``): the Trainer then gathers every micro-batch's token count across the
ranks and reads it back with ``.item()``, a sync point per micro-batch where gradient accumulation would
otherwise let the ranks run apart until the step's all-reduce.

--tokens-seen all|non_padding|no   the Trainer's setting (default: all, i.e. True)
--accum K                          micro-batches per optimizer step
--losses PATH                      each rank appends one line per micro-batch, its loss, to PATH.rank<R>
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import TokenDataset, examples, pad_collate, tiny_llama


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--tokens-seen", default="all", choices=("all", "non_padding", "no"))
    p.add_argument("--losses", type=Path, default=None)
    args = p.parse_args()

    from transformers import Trainer, TrainingArguments

    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank = int(os.environ.get("RANK", "0"))
    out = None if args.losses is None else open(f"{args.losses}.rank{rank}", "a")  # noqa: SIM115

    class Recording(Trainer):
        def compute_loss(
            self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None
        ) -> Any:
            result: Any = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if out is not None:
                loss = result[0] if return_outputs else result
                out.write(f"{loss.item().hex()}\n")
                out.flush()
            return result

    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=args.batch,
            gradient_accumulation_steps=args.accum,
            max_steps=args.steps,
            learning_rate=1e-3,
            logging_steps=1000,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            dataloader_num_workers=0,
            remove_unused_columns=False,
            include_num_input_tokens_seen=True if args.tokens_seen == "all" else args.tokens_seen,
        )
        trainer = Recording(
            model=tiny_llama("sdpa", max_len=128),
            args=targs,
            train_dataset=TokenDataset(examples(2048, 0, hi=100)),
            data_collator=pad_collate(None),
        )
        trainer.train()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
