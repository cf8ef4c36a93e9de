"""The built-in demo fine-tune: a small Llama-style model on the standard library's docstrings.

Naive (the default) plants three common causes on purpose:
  * examples are tokenized inside the collate function, in the training process (num_workers=0);
  * every row is padded to a fixed maximum length (padding="max_length");
  * the model uses eager attention.
On a GPU it also trains in plain fp32. ``--fixed`` runs the same model on the same data with the fixes:
tokenized once up front, packed into full rows (best-fit decreasing, positions restart per example so no
token attends across examples), SDPA, and on a GPU two DataLoader workers and bf16 autocast.

It is an ordinary PyTorch training script: ``pitstop doctor --demo`` runs it under the zero-code probe.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

IGNORE = -100
SYSTEM = "You are a helpful assistant who knows the Python standard library."
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class ModelSize:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    max_len: int
    batch: int
    workers: int  # DataLoader workers in the fixed run


# On a CPU the model is tiny on purpose: a CPU computes ~100x slower than a GPU, and a tiny model keeps the
# input pipeline's share of the step close to what it would be next to a GPU.
CPU_SIZE = ModelSize(hidden=64, layers=2, heads=2, intermediate=172, max_len=256, batch=8, workers=0)
GPU_SIZE = ModelSize(hidden=768, layers=8, heads=12, intermediate=2048, max_len=1024, batch=8, workers=2)


def load_pairs(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_tokenizer(path: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(path), pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


class JsonlPairs:
    """Examples read lazily from the JSONL file, one line per access (the way large datasets often are)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offsets: list[int] = []
        with path.open("rb") as f:
            offset = 0
            for line in f:
                if line.strip():
                    self.offsets.append(offset)
                offset += len(line)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int) -> dict[str, str]:
        with self.path.open("rb") as f:
            f.seek(self.offsets[i])
            return json.loads(f.readline())


def messages(example: dict[str, str]) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": example["instruction"]},
        {"role": "assistant", "content": example["response"]},
    ]


class TokenizeAndPad:
    """Collate, the way many hand-written SFT scripts do it: render the chat template per example, tokenize
    the prompt and the whole conversation to mask the prompt out of the loss, pad every row to max_len."""

    def __init__(self, tokenizer: Any, max_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_len = max_len

    def __call__(self, examples: list[dict[str, str]]) -> dict[str, Any]:
        import torch

        rows, labels = [], []
        for example in examples:
            conversation = messages(example)
            prompt = self.tokenizer.apply_chat_template(
                conversation[:-1], tokenize=False, add_generation_prompt=True
            )
            text = self.tokenizer.apply_chat_template(conversation, tokenize=False)
            n_prompt = len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
            ids = self.tokenizer(text, add_special_tokens=False, truncation=True, max_length=self.max_len)[
                "input_ids"
            ]
            rows.append({"input_ids": ids})
            labels.append([IGNORE] * min(n_prompt, len(ids)) + ids[n_prompt:])
        batch = self.tokenizer.pad(rows, padding="max_length", max_length=self.max_len, return_tensors="pt")
        batch["labels"] = torch.tensor([row + [IGNORE] * (self.max_len - len(row)) for row in labels])
        return dict(batch)


def tokenize_all(
    tokenizer: Any, pairs: list[dict[str, str]], max_len: int
) -> list[tuple[list[int], list[int]]]:
    """Token ids and labels (prompt masked) for every example, once, before training: the same ids and
    labels TokenizeAndPad makes, batched through the tokenizer in one call."""
    conversations = [messages(p) for p in pairs]
    prompts = [
        tokenizer.apply_chat_template(c[:-1], tokenize=False, add_generation_prompt=True)
        for c in conversations
    ]
    texts = [tokenizer.apply_chat_template(c, tokenize=False) for c in conversations]
    full = tokenizer(texts, add_special_tokens=False, truncation=True, max_length=max_len)["input_ids"]
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    out = []
    for ids, pr in zip(full, prompt_ids, strict=True):
        n = min(len(pr), len(ids))
        out.append((ids, [IGNORE] * n + ids[n:]))
    return out


class PackedRows:
    """Pre-tokenized examples packed into rows of at most max_len tokens (best-fit decreasing)."""

    def __init__(self, examples: list[tuple[list[int], list[int]]], max_len: int) -> None:
        from pitstop.data import plan_packing

        self.examples = examples
        self.max_len = max_len
        self.rows = plan_packing([len(ids) for ids, _ in examples], max_len).bins

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> list[int]:
        return self.rows[i]


class PackedCollate:
    """Concatenate each row's examples; positions restart at 0 per example, and the first label of every
    example is ignored, so neither attention nor the loss crosses an example boundary. The unused tail of a
    row is padding, kept apart as its own position run and ignored by the loss."""

    def __init__(self, examples: list[tuple[list[int], list[int]]], max_len: int, pad_id: int) -> None:
        self.examples = examples
        self.max_len = max_len
        self.pad_id = pad_id

    def __call__(self, rows: list[list[int]]) -> dict[str, Any]:
        import torch

        ids_rows, label_rows, pos_rows = [], [], []
        for row in rows:
            ids: list[int] = []
            labels: list[int] = []
            positions: list[int] = []
            for i in row:
                ex_ids, ex_labels = self.examples[i]
                ids += ex_ids
                labels += [IGNORE, *ex_labels[1:]]
                positions += list(range(len(ex_ids)))
            pad = self.max_len - len(ids)
            ids += [self.pad_id] * pad
            labels += [IGNORE] * pad
            positions += list(range(pad))
            ids_rows.append(ids)
            label_rows.append(labels)
            pos_rows.append(positions)
        return {
            "input_ids": torch.tensor(ids_rows),
            "labels": torch.tensor(label_rows),
            "position_ids": torch.tensor(pos_rows),
        }


def build_model(size: ModelSize, vocab: int, attn: str, pad_id: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.heads,
        max_position_embeddings=size.max_len,
        use_cache=False,
        pad_token_id=pad_id,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM._from_config(config, attn_implementation=attn)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="pitstop's demo fine-tune")
    parser.add_argument("--fixed", action="store_true", help="apply the fixes")
    parser.add_argument(
        "--steps", type=int, default=100_000, help="optimizer steps (the probe stops it sooner)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = parser.parse_args(argv)

    import torch
    from torch.utils.data import DataLoader

    from pitstop.demo.prepare import ensure_demo_assets

    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = "cpu" if device == "auto" else device
    size = GPU_SIZE if device == "cuda" else CPU_SIZE
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    assets = ensure_demo_assets()
    tokenizer = load_tokenizer(assets.tokenizer)
    generator = torch.Generator().manual_seed(args.seed)
    if args.fixed:
        examples = tokenize_all(tokenizer, load_pairs(assets.data), size.max_len)
        dataset: Any = PackedRows(examples, size.max_len)
        collate: Any = PackedCollate(examples, size.max_len, tokenizer.pad_token_id)
        loader = DataLoader(
            dataset,
            batch_size=size.batch,
            shuffle=True,
            collate_fn=collate,
            # batches of ready token ids cost ~0.1 ms to collate; on a 2-core CPU a worker process would only
            # compete with the compute threads, next to a GPU two workers keep the next batch ready
            num_workers=size.workers,
            persistent_workers=size.workers > 0,
            pin_memory=device == "cuda",
            generator=generator,
        )
        attn = "sdpa"
    else:
        loader = DataLoader(
            cast(Any, JsonlPairs(assets.data)),  # map-style: __len__ and __getitem__ are all DataLoader needs
            batch_size=size.batch,
            shuffle=True,
            collate_fn=TokenizeAndPad(tokenizer, size.max_len),
            num_workers=0,
            generator=generator,
        )
        attn = "eager"
    model = build_model(size, len(tokenizer), attn, tokenizer.pad_token_id).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0)
    use_bf16 = args.fixed and device == "cuda"
    if use_bf16:
        torch.backends.cuda.matmul.allow_tf32 = True

    step = 0
    while step < args.steps:
        for batch in loader:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=use_bf16):
                loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % 20 == 0:
                print(f"step {step} loss {loss.item():.3f}", flush=True)
            if step >= args.steps:
                break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
