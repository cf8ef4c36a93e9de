"""Fine-tune a tiny GPT-2 on GSM8K with a plain PyTorch training loop.

This follows the classic "train from scratch with your own loop" tutorial:
read the GSM8K question/answer JSONL, train a small byte-level BPE tokenizer on
it with the ``tokenizers`` library, tokenize each example inside a ``Dataset``,
pad batches in a ``collate_fn``, and train a small randomly initialised GPT-2
(built from ``GPT2Config``) with AdamW, a linear warmup/decay schedule,
gradient clipping and a loss printout every few steps. Everything runs on CPU
and nothing is written to disk.
"""

import argparse
import json
import time

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast, get_linear_schedule_with_warmup

DATA_PATH = "/work/shared/data/datasets/gsm8k_train.jsonl"


def load_texts(path, eos):
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    return [f"Question: {r['question']}\nAnswer: {r['answer']}{eos}" for r in rows]


def train_tokenizer(texts, vocab_size=4096):
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


class GSM8KDataset(Dataset):
    def __init__(self, texts, tokenizer, max_length=128):
        self.examples = []
        for text in texts:
            ids = tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
            self.examples.append(torch.tensor(ids, dtype=torch.long))

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, idx):
        return self.examples[idx]


def make_collate_fn(pad_id):
    def collate(batch):
        input_ids = torch.nn.utils.rnn.pad_sequence(batch, batch_first=True, padding_value=pad_id)
        attention_mask = torch.zeros_like(input_ids)
        for i, seq in enumerate(batch):
            attention_mask[i, : len(seq)] = 1
        labels = input_ids.clone()
        labels[attention_mask == 0] = -100  # don't compute loss on padding
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}

    return collate


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    texts = load_texts(DATA_PATH, eos="<|endoftext|>")
    tokenizer = train_tokenizer(texts)
    print(f"trained tokenizer with {len(tokenizer)} tokens on {len(texts)} examples")

    # Only tokenize as many examples as we will actually consume.
    dataset = GSM8KDataset(texts[: args.max_steps * args.batch_size], tokenizer)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, collate_fn=make_collate_fn(tokenizer.pad_token_id)
    )

    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=256,
        n_embd=128,
        n_layer=2,
        n_head=4,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = GPT2LMHeadModel(config).to(device)
    print(f"model parameters: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M")

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(
        optimizer, num_warmup_steps=args.max_steps // 10, num_training_steps=args.max_steps
    )

    model.train()
    step = 0
    start = time.time()
    while step < args.max_steps:
        for batch in loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            outputs = model(**batch)
            loss = outputs.loss

            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optimizer.step()
            scheduler.step()
            step += 1

            if step % args.log_every == 0 or step == 1:
                print(f"step {step:4d} | loss {loss.item():.4f} | lr {scheduler.get_last_lr()[0]:.2e}")
            if step >= args.max_steps:
                break

    print(f"done: {step} steps in {time.time() - start:.1f}s")


if __name__ == "__main__":
    main()
