"""A tiny Accelerate training loop (CPU, gloo) for `accelerate launch` with several processes or machines.

The Accelerator sets up the process group from the launcher's variables; the loop is the one the
Accelerate examples show: prepare, then forward, ``accelerator.backward``, step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from common import TokenDataset, examples, packed_collate, packed_rows, tiny_llama


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=4)
    args = p.parse_args()

    accelerator = Accelerator(cpu=True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dataset = TokenDataset(packed_rows(examples(512, 0), 128))  # type: ignore[arg-type]
    loader = DataLoader(dataset, batch_size=args.batch, shuffle=True, collate_fn=packed_collate)
    model = tiny_llama("sdpa", max_len=128)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    step = 0
    while step < args.steps:
        for batch in loader:
            loss = model(**batch).loss
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step >= args.steps:
                break
    accelerator.wait_for_everyone()
    print(f"process {accelerator.process_index} of {accelerator.num_processes} done")
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
