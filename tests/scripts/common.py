"""Shared pieces of the test training scripts: a tiny Llama and synthetic token data of varied lengths."""

from __future__ import annotations

import random
import time
from typing import Any

import torch

VOCAB = 512
PAD = 0


def tiny_llama(attn: str, max_len: int = 256, hidden: int = 64, layers: int = 2) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=max_len,
        use_cache=False,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM._from_config(config, attn_implementation=attn)


def examples(n: int, seed: int, lo: int = 16, hi: int = 120) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


class TokenDataset(torch.utils.data.Dataset):
    """Pre-tokenized examples; ``slow_ms`` stands in for slow storage (a blocking read per example)."""

    def __init__(self, data: list[list[int]], slow_ms: float = 0.0) -> None:
        self.data = data
        self.slow_ms = slow_ms

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        if self.slow_ms:
            time.sleep(self.slow_ms / 1000.0)
        item = self.data[i]
        return item if isinstance(item, dict) else {"input_ids": item}


def pad_collate(pad_to: int | None) -> Any:
    """Pad to a fixed length (pad_to) or to the longest example of the batch (None)."""

    def collate(batch: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        length = pad_to or max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), length), PAD, dtype=torch.long)
        mask = torch.zeros((len(batch), length), dtype=torch.long)
        for row, b in enumerate(batch):
            seq = b["input_ids"][:length]
            ids[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = 1
        labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    return collate


def packed_rows(data: list[list[int]], max_len: int) -> list[dict[str, list[int]]]:
    """First-fit-decreasing rows of whole examples; positions restart per example, and the first label of
    each example is ignored so no prediction crosses a boundary."""
    rows: list[dict[str, list[int]]] = []
    for ex in sorted(data, key=len, reverse=True):
        row = next((r for r in rows if len(r["input_ids"]) + len(ex) <= max_len), None)
        if row is None:
            row = {"input_ids": [], "position_ids": [], "labels": []}
            rows.append(row)
        row["input_ids"] += ex
        row["position_ids"] += list(range(len(ex)))
        row["labels"] += [-100, *ex[1:]]
    return rows


def packed_collate(batch: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    length = max(len(b["input_ids"]) for b in batch)
    out = {
        k: torch.full((len(batch), length), fill, dtype=torch.long)
        for k, fill in (("input_ids", PAD), ("position_ids", 0), ("labels", -100))
    }
    for row, b in enumerate(batch):
        n = len(b["input_ids"])
        for k in out:
            out[k][row, :n] = torch.tensor(b[k])
        out["position_ids"][row, n:] = torch.arange(length - n)
    return out


def tiny_tokenizer() -> Any:
    """A word-level tokenizer over the synthetic vocabulary (TRL wants a processing class)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
