"""A torch.compile'd Llama fine-tune (a real compile with a CPU backend) whose batch shapes can change, for the
recompiles cause (issue 40).

* default: ``torch.compile(model, backend="aot_eager", dynamic=False)`` and batches padded to their longest
  example, the issue's repro: a new length nearly every batch, a compile for each, until the frame reaches
  torch's recompile limit (8) and runs eagerly from then on;
* ``--grow-every K``: a sequence-length curriculum (the length grows by ``--grow-by`` tokens every K steps,
  every example cut or padded to it), with ``--recompile-limit N`` raised as a user does after the warning:
  a recompile every K steps, all run long;
* ``--pad-to N``: every batch one fixed shape (the negative control: one compile, in the warm-up);
* ``--dynamic none|true``: the fix (torch's automatic dynamic shapes, or symbolic shapes from the start);
* ``--compile layers|loss``: what is compiled, if not the whole model: each decoder layer ``compile()``d in
  place, or only the loss function (the model runs eagerly).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from common import PAD, TokenDataset, examples, pad_collate, tiny_llama

DYNAMIC = {"false": False, "none": None, "true": True}


def curriculum(lengths: list[int]) -> Callable[[list[dict[str, list[int]]]], dict[str, torch.Tensor]]:
    """Cut or pad every example of the batch to the length of the curriculum's current phase."""

    def collate(batch: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        length = lengths[0]
        ids = torch.full((len(batch), length), PAD, dtype=torch.long)
        mask = torch.zeros((len(batch), length), dtype=torch.long)
        for row, b in enumerate(batch):
            seq = b["input_ids"][:length]
            ids[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    return collate


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dynamic", choices=sorted(DYNAMIC), default="false")
    p.add_argument("--backend", default="aot_eager")
    p.add_argument("--pad-to", type=int, default=None, help="pad every batch to this length (fixed shapes)")
    p.add_argument("--grow-every", type=int, default=None, help="a longer sequence length every K steps")
    p.add_argument("--grow-by", type=int, default=8)
    p.add_argument("--start-len", type=int, default=32)
    p.add_argument("--recompile-limit", type=int, default=None, help="torch._dynamo's recompile limit")
    p.add_argument("--module-compile", action="store_true", help="model.compile() in place of torch.compile")
    p.add_argument("--compile", choices=("model", "layers", "loss"), default="model", help="what is compiled")
    p.add_argument(
        "--losses", type=Path, default=None, help="append the loss of every step here, a line each"
    )
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.recompile_limit is not None:
        torch._dynamo.config.recompile_limit = args.recompile_limit

    torch.manual_seed(args.seed)
    data = examples(2048, args.seed, lo=16, hi=120 if args.grow_every is None else 480)
    phase = [args.start_len]
    collate = curriculum(phase) if args.grow_every else pad_collate(args.pad_to)
    loader = DataLoader(
        TokenDataset(data),
        batch_size=args.batch,
        shuffle=True,
        collate_fn=collate,
        generator=torch.Generator().manual_seed(args.seed),
    )
    model = tiny_llama("sdpa", max_len=512)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dynamic = DYNAMIC[args.dynamic]
    run, loss_of = model, None
    if args.compile == "layers":
        for layer in model.model.layers:
            layer.compile(backend=args.backend, dynamic=dynamic)
    elif args.compile == "loss":

        def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            shifted = logits[:, :-1].reshape(-1, logits.shape[-1])
            return torch.nn.functional.cross_entropy(shifted, labels[:, 1:].reshape(-1), ignore_index=-100)

        loss_of = torch.compile(token_loss, backend=args.backend, dynamic=dynamic)
    elif args.module_compile:
        model.compile(backend=args.backend, dynamic=dynamic)
    else:
        run = torch.compile(model, backend=args.backend, dynamic=dynamic)

    losses = args.losses.open("w") if args.losses else None  # a line a step: pitstop may stop the job
    step = 0
    while step < args.steps:
        for batch in loader:
            if loss_of is None:
                loss = run(**batch).loss
            else:
                labels = batch.pop("labels")
                loss = loss_of(run(**batch).logits, labels)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if losses is not None:
                losses.write(f"{float(loss.detach())!r}\n")
                losses.flush()
            step += 1
            if args.grow_every and step % args.grow_every == 0:
                phase[0] = min(phase[0] + args.grow_by, 480)
            if step >= args.steps:
                break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
