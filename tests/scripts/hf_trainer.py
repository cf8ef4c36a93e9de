"""A Hugging Face Trainer fine-tune with switchable planted causes (for pitstop's integration tests)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import (
    TokenDataset,
    examples,
    packed_collate,
    packed_rows,
    pad_collate,
    tiny_llama,
    tiny_tokenizer,
)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--accum", type=int, default=1, help="gradient accumulation steps")
    p.add_argument("--attn", default="sdpa")
    p.add_argument("--pad-to", type=int, default=None)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--packed", action="store_true")
    p.add_argument("--callback", type=Path, default=None, help="use PitstopCallback, writing its JSON here")
    p.add_argument("--trl", action="store_true", help="train with TRL's SFTTrainer instead")
    p.add_argument("--save-steps", type=int, default=0, help="save a checkpoint every N steps (0: never)")
    p.add_argument("--watch-window", type=int, default=None, help="PitstopCallback(mode='watch') windows")
    p.add_argument("--report-to", default="none", help="the Trainer's own report_to, comma-separated")
    p.add_argument("--logging-steps", type=int, default=1000)
    p.add_argument("--slow-after", type=int, default=None, help="from this step on, reads take 40 ms each")
    args = p.parse_args()

    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    data = examples(512, 0)
    if args.packed:
        dataset = TokenDataset(packed_rows(data, 256), args.slow_ms)  # type: ignore[arg-type]
        collate = packed_collate
    else:
        dataset = TokenDataset(data, args.slow_ms)
        collate = pad_collate(args.pad_to)
    callbacks = []
    if args.callback:
        from pitstop.integrations.hf import PitstopCallback

        if args.watch_window:
            callbacks.append(
                PitstopCallback(
                    warmup=3, json_path=args.callback, mode="watch", window_steps=args.watch_window
                )
            )
        else:
            callbacks.append(PitstopCallback(steps=args.steps - 3, warmup=3, json_path=args.callback))
    if args.slow_after is not None:
        from transformers import TrainerCallback

        class SlowAfter(TrainerCallback):  # type: ignore[misc]
            def on_step_end(self, targs: object, state: object, control: object, **kw: object) -> None:
                if getattr(state, "global_step", 0) == args.slow_after:
                    dataset.slow_ms = 40.0

        callbacks.append(SlowAfter())
    with tempfile.TemporaryDirectory() as out:
        common = dict(
            output_dir=out,
            per_device_train_batch_size=args.batch,
            gradient_accumulation_steps=args.accum,
            max_steps=args.steps,
            learning_rate=1e-3,
            logging_steps=args.logging_steps,
            save_strategy="steps" if args.save_steps else "no",
            save_steps=args.save_steps or 500,
            report_to=args.report_to.split(","),
            use_cpu=True,
            dataloader_num_workers=0,
            remove_unused_columns=False,
        )
        if args.trl:
            from datasets import Dataset
            from trl import SFTConfig, SFTTrainer

            rows = [dataset[i] for i in range(len(dataset))]
            trainer = SFTTrainer(
                model=tiny_llama(args.attn),
                args=SFTConfig(**common, dataset_kwargs={"skip_prepare_dataset": True}),
                train_dataset=Dataset.from_list(rows),
                data_collator=collate,
                callbacks=callbacks,
                processing_class=tiny_tokenizer(),
            )
        else:
            trainer = Trainer(
                model=tiny_llama(args.attn),
                args=TrainingArguments(**common),
                train_dataset=dataset,
                data_collator=collate,
                callbacks=callbacks,
            )
        trainer.train()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
