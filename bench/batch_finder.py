"""Finding the largest micro-batch under a real memory cap: pitstop's finder vs Lightning's
``scale_batch_size`` (power and binsearch) vs Hugging Face's ``auto_find_batch_size`` (accelerate's
``find_executable_batch_size``), on the same CPU job.

Every trial step runs in a fresh process on a tiny Llama (1,024-token rows): after the model is built and
one step has run, the process's address space is capped (RLIMIT_AS) at its size plus a budget, so a batch
that needs more fails with the allocator's real out-of-memory error. A fresh process per trial keeps one
trial's failure from changing the next (freed heap is not always returned), so every method sees the same
limit. The true limit is found by trying every size; each method reports the size it chose and its trials.

    python bench/batch_finder.py            # about 5 minutes
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SEQ, VOCAB, HIDDEN, LAYERS = 1024, 8192, 256, 2
BUDGET = 1536 * 2**20  # bytes the trials may use above the process's size after warm-up


def job() -> tuple[Any, Any, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(2)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=4 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        use_cache=False,
    )
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch: int) -> None:
        ids = torch.randint(0, VOCAB, (batch, SEQ))
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, optimizer, step


def cap_memory() -> None:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[0])
    size = pages * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + BUDGET, resource.RLIM_INFINITY))


def predicted_batch() -> int:
    """pitstop's memory model: activations and logits per row of this model, against the budget."""
    from pitstop.core.profile import ModelInfo
    from pitstop.plan.memory import Setup, activations, logits

    shape = ModelInfo(
        n_layers=LAYERS,
        hidden_size=HIDDEN,
        intermediate_size=4 * HIDDEN,
        n_heads=4,
        head_dim=HIDDEN // 4,
        n_kv_heads=4,
        vocab_size=VOCAB,
    )
    s = Setup(shape, seq=SEQ)
    per_row = activations(s) + logits(s)
    return max(1, int(BUDGET / per_row))


def trial(batch: int) -> int:
    """One capped step in this process: exit status 0 if it ran, 3 if it ran out of memory."""
    from pitstop.plan.batch_finder import is_out_of_memory

    _, _, step = job()
    step(1)
    cap_memory()
    try:
        step(batch)
    except BaseException as exc:
        if is_out_of_memory(exc):
            return 3
        raise
    return 0


def run(method: str) -> dict[str, Any]:
    sizes: list[int] = []

    def counted(batch: int) -> None:
        sizes.append(batch)
        proc = subprocess.run(
            [sys.executable, __file__, "--trial", str(batch)], capture_output=True, text=True
        )
        if proc.returncode == 3:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory (in the trial process)")
        if proc.returncode != 0:
            raise SystemExit(f"trial {batch} failed: {proc.stderr[-300:]}")

    if method == "scan":
        from pitstop.plan.batch_finder import is_out_of_memory

        largest = 0
        for b in range(1, 4096):
            try:
                counted(b)
                largest = b
            except BaseException as exc:
                if not is_out_of_memory(exc):
                    raise
                break
        return {"chosen": largest, "trials": len(sizes)}
    if method == "pitstop":
        from pitstop.plan.batch_finder import find_batch_size

        result = find_batch_size(counted, predicted_batch())
        return {"chosen": result.largest, "trials": result.trial_count, "predicted": predicted_batch()}
    if method == "hf_auto_find_batch_size":
        from accelerate.utils import find_executable_batch_size

        @find_executable_batch_size(starting_batch_size=128)
        def train(batch_size: int) -> int:
            counted(batch_size)
            return batch_size

        return {"chosen": train(), "trials": len(sizes)}
    return run_lightning(method.split("_")[-1], counted, sizes)


def run_lightning(mode: str, counted: Any, sizes: list[int]) -> dict[str, Any]:
    import lightning as L
    import torch
    from lightning.pytorch.tuner import Tuner
    from torch.utils.data import DataLoader, Dataset

    class Rows(Dataset):
        def __len__(self) -> int:
            return 1 << 20

        def __getitem__(self, i: int) -> int:
            return i

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.batch_size = 2
            self.anchor = torch.nn.Parameter(torch.zeros(1))

        def train_dataloader(self) -> DataLoader:
            return DataLoader(Rows(), batch_size=self.batch_size)

        def training_step(self, batch: Any, idx: int) -> Any:
            counted(len(batch))  # the real step, outside Lightning's own optimizer
            return (self.anchor * 0).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD([self.anchor], lr=0.0)

    trainer = L.Trainer(
        accelerator="cpu",
        default_root_dir=tempfile.mkdtemp(),  # Lightning saves and restores a checkpoint here
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    chosen = Tuner(trainer).scale_batch_size(
        Module(), mode=mode, init_val=2, steps_per_trial=1, max_trials=25
    )
    return {"chosen": chosen, "trials": len(set(sizes)), "steps": len(sizes)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--trial", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.trial:
        return trial(args.trial)
    if args.method:
        print(json.dumps(run(args.method)))
        return 0
    results = {}
    for method in ("scan", "pitstop", "lightning_binsearch", "lightning_power", "hf_auto_find_batch_size"):
        proc = subprocess.run([sys.executable, __file__, "--method", method], capture_output=True, text=True)
        line = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else ""
        results[method] = json.loads(line) if line.startswith("{") else {"error": proc.stderr.strip()[-300:]}
    true = results["scan"].get("chosen")
    print(
        f"job: tiny Llama, rows of {SEQ} tokens, {BUDGET / 2**20:.0f} MiB allowed above the warmed-up process"
    )
    print(f"true largest micro-batch (found by trying every size): {true}")
    print(f"{'method':26} {'chosen':>7} {'trial steps':>12}   note")
    for method, r in results.items():
        if method == "scan":
            continue
        if "error" in r:
            print(f"{method:26} {'-':>7} {'-':>12}   failed: {r['error'][-120:]}")
            continue
        note = "the true limit" if r["chosen"] == true else f"{r['chosen'] - true:+d} vs the true limit"
        if "predicted" in r:
            note += f"; started from the plan's prediction {r['predicted']}"
        print(f"{method:26} {r['chosen']:>7} {r['trials']:>12}   {note}")
    if args.json:
        args.json.write_text(json.dumps({"true": true, **results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
