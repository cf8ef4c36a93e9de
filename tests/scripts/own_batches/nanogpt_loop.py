"""A training loop shaped like the most-copied scripts: no DataLoader, its own ``get_batch()`` indexing a tensor of
token blocks, ``model(X, Y)`` called positionally (a tiny GPT that ignores targets of -1), or keyword inputs to a
Hugging Face model (padded rows with an attention mask). The update is switchable: a plain optimizer step, a
closure, an optimizer stepped inside backward from per-parameter gradient hooks, or a hand-written SGD update with
no optimizer at all. Writes each step's loss and the padding it built, to compare with pitstop's figures."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).parent.parent))
from common import PAD, VOCAB, tiny_llama

BLOCK = 64


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = VOCAB, width: int = 64) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(BLOCK, width)
        self.block = nn.TransformerEncoderLayer(width, 2, 2 * width, dropout=0.0, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, Any]:
        pos = torch.arange(idx.shape[1])
        causal = nn.Transformer.generate_square_subsequent_mask(idx.shape[1])
        x = self.block(self.wte(idx) + self.wpe(pos), src_mask=causal, is_causal=True)
        logits = self.head(x)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--inputs", choices=("positional", "keywords", "padded"), default="positional")
    p.add_argument("--update", choices=("optimizer", "closure", "in-backward", "manual"), default="optimizer")
    p.add_argument("--out", type=Path, default=None, help="write the losses and the padding built here")
    args = p.parse_args()
    torch.manual_seed(0)
    data = torch.randint(3, VOCAB, (4096 * 4,))  # the training text, already tokenized
    model: nn.Module = TinyGPT() if args.inputs == "positional" else tiny_llama("sdpa", max_len=BLOCK + 1)
    padding = [0, 0]  # pad tokens, all tokens built

    def get_batch() -> dict[str, torch.Tensor]:
        ix = torch.randint(len(data) - BLOCK - 1, (args.batch,))
        x = torch.stack([data[i : i + BLOCK] for i in ix])
        y = torch.stack([data[i + 1 : i + 1 + BLOCK] for i in ix])
        mask = torch.ones_like(x)
        if args.inputs == "padded":  # rows of 16..64 tokens, right-padded
            for row, n in enumerate(torch.randint(16, BLOCK + 1, (args.batch,)).tolist()):
                x[row, n:], mask[row, n:] = PAD, 0
        padding[0] += int((mask == 0).sum())
        padding[1] += mask.numel()
        return {"x": x, "y": y, "mask": mask}

    def loss_of(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if args.inputs == "positional":
            return model(batch["x"], batch["y"])[1]
        labels = batch["x"].masked_fill(batch["mask"] == 0, -100)
        return model(input_ids=batch["x"], attention_mask=batch["mask"], labels=labels).loss

    params = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.SGD(params, lr=0.01) if args.update in ("optimizer", "closure") else None
    if args.update == "in-backward":  # one optimizer per parameter, stepped as its gradient is ready
        per_param = {q: torch.optim.AdamW([q], lr=1e-3) for q in params}

        def step_now(q: torch.Tensor) -> None:
            per_param[q].step()
            per_param[q].zero_grad()

        for q in params:
            q.register_post_accumulate_grad_hook(step_now)
    losses: list[float] = []
    for _ in range(args.steps):
        batch = get_batch()
        if args.update == "closure":
            assert opt is not None

            def closure(batch: dict[str, torch.Tensor] = batch) -> torch.Tensor:
                opt.zero_grad(set_to_none=True)
                loss = loss_of(batch)
                loss.backward()
                return loss

            loss = opt.step(closure)
        else:
            loss = loss_of(batch)
            loss.backward()
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)
            elif args.update == "manual":
                with torch.no_grad():
                    for q in params:
                        q -= 0.01 * q.grad  # type: ignore[operator]
                        q.grad = None
        losses.append(float(loss.detach()))
        if args.out is not None:  # each step, whole or not at all: the probe may end the job at any moment
            partial = args.out.with_suffix(".partial")
            partial.write_text(json.dumps({"losses": losses, "padding": padding}))
            partial.replace(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
