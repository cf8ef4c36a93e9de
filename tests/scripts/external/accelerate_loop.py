"""Fine-tune a tiny Qwen2-style model on GSM8K with an ``accelerate`` training loop.

Modelled on the Hugging Face Accelerate examples: build an ``Accelerator``,
tokenize GSM8K question/answer pairs with ``datasets.Dataset.map`` under
``main_process_first()``, pad each batch with ``DataCollatorWithPadding``-style
dynamic padding, then ``accelerator.prepare`` the model, optimizer, dataloader
and scheduler and train with ``accelerator.accumulate`` /
``accelerator.backward`` / ``clip_grad_norm_``. The tokenizer is the stock GPT-2
tokenizer loaded from a local file; the model is randomly initialised from a
small ``Qwen2Config``. Runs on CPU and writes nothing to disk.
"""

import argparse
import json

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from datasets import Dataset
from torch.utils.data import DataLoader
from transformers import (
    AutoModelForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    get_cosine_schedule_with_warmup,
)

DATA_PATH = "/work/shared/data/datasets/gsm8k_train.jsonl"
TOKENIZER_PATH = "/work/shared/data/tokenizers/gpt2_tokenizer.json"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=200, help="number of optimizer updates")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--grad-accum", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum, cpu=not torch.cuda.is_available())
    set_seed(42)

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=TOKENIZER_PATH, eos_token="<|endoftext|>")
    tokenizer.pad_token = tokenizer.eos_token

    with open(DATA_PATH) as f:
        rows = [json.loads(line) for line in f]
    rows = rows[: args.max_steps * args.batch_size * args.grad_accum]
    raw = Dataset.from_list(rows)

    def tokenize(example):
        text = f"Question: {example['question']}\nAnswer: {example['answer']}{tokenizer.eos_token}"
        return tokenizer(text, truncation=True, max_length=args.max_length)

    with accelerator.main_process_first():
        tokenized = raw.map(tokenize, remove_columns=raw.column_names)

    def collate_fn(features):
        batch = tokenizer.pad(features, padding="longest", return_tensors="pt")
        labels = batch["input_ids"].clone()
        labels[batch["attention_mask"] == 0] = -100
        batch["labels"] = labels
        return batch

    train_dataloader = DataLoader(tokenized, batch_size=args.batch_size, shuffle=True, collate_fn=collate_fn)

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = AutoModelForCausalLM.from_config(config)
    accelerator.print(f"model parameters: {model.num_parameters() / 1e6:.2f}M on {accelerator.device}")

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = get_cosine_schedule_with_warmup(
        optimizer, num_warmup_steps=10, num_training_steps=args.max_steps
    )

    model, optimizer, train_dataloader, scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, scheduler
    )

    model.train()
    completed_steps = 0
    while completed_steps < args.max_steps:
        for batch in train_dataloader:
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()

            if accelerator.sync_gradients:
                completed_steps += 1
                if completed_steps % 10 == 0:
                    loss_value = accelerator.gather(loss.detach()).mean().item()
                    accelerator.print(f"step {completed_steps}: loss {loss_value:.4f}")
                if completed_steps >= args.max_steps:
                    break

    accelerator.wait_for_everyone()
    accelerator.print("training finished")
    accelerator.end_training()


if __name__ == "__main__":
    main()
