"""A tiny Llama (Transformers, from a config) fine-tuned in a plain loop, for library_upgrade's tests.

``--pretend transformers=4.57.1,torch=2.8.0`` makes the job present those versions the way an older
installation would: each module's own ``__version__``, which is what pitstop's probe reads from the modules the
job loaded. ``--slow-forward-ms`` plants a slowdown inside the model's forward (a sleep in a forward hook of
its first decoder layer, as a slower kernel of a newer release would cost).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from common import TokenDataset, examples, packed_collate, packed_rows, tiny_llama


def pretend(versions: str) -> None:
    """Each ``name=version``: the loaded module ``name`` reports ``version`` from now on."""
    for item in filter(None, versions.split(",")):
        name, _, version = item.partition("=")
        sys.modules[name].__version__ = version  # type: ignore[attr-defined]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--pretend", default="", help="name=version,... as an older installation reports")
    p.add_argument("--slow-forward-ms", type=float, default=0.0)
    args = p.parse_args()
    torch.set_num_threads(1)  # steadier on a busy machine
    torch.manual_seed(0)
    model = tiny_llama("sdpa")
    if args.slow_forward_ms:

        def slower_kernel(module: Any, inputs: Any) -> None:
            time.sleep(args.slow_forward_ms / 1000)

        model.model.layers[0].register_forward_pre_hook(slower_kernel)
    import accelerate  # noqa: F401  (loaded by the job, as a Trainer would: its version is recorded too)
    import transformers  # noqa: F401

    pretend(args.pretend)
    loader = DataLoader(
        TokenDataset(packed_rows(examples(256, 0), 128)),
        batch_size=args.batch,
        shuffle=True,
        collate_fn=packed_collate,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step = 0
    while step < args.steps:
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step >= args.steps:
                break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
