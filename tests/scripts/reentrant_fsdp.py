"""Plants reentrant_checkpointing: a LoRA fine-tune (peft adapters on a frozen tiny Llama) sharded by FSDP on
two gloo ranks (torchrun), whose decoder layers are checkpointed with ``checkpoint_wrapper(REENTRANT)`` applied
before FSDP wraps them, so each checkpoint holds a whole FSDP unit: the reentrant recompute all-gathers the
unit's parameters for itself, FSDP reshards them, and the unit's backward all-gathers them again (13
all-gathers a step against 9 non-reentrant, four layers). Wide layers and a small batch make those all-gathers
most of the step, as on a slow link.

``--impl non-reentrant`` is the fixed job (the same math); ``--impl hf`` checkpoints with Transformers' own
``gradient_checkpointing_enable(use_reentrant=True)``, which keeps each FSDP unit's hooks outside the
checkpoint: reentrant where it repeats nothing. ``--losses PREFIX`` writes each rank's losses to
``PREFIX.rank<r>``."""

from __future__ import annotations

import argparse
import functools
import os
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

sys.path.insert(0, str(Path(__file__).parent))
from common import tiny_llama


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--impl", choices=("reentrant", "non-reentrant", "hf"), default="reentrant")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=8)
    p.add_argument("--losses", type=Path, default=None, help="append each step's loss to PREFIX.rank<r>")
    args = p.parse_args()
    warnings.filterwarnings("ignore")  # FSDP1's deprecation, peft's and Transformers' notes
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    from peft import LoraConfig, get_peft_model
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = tiny_llama("sdpa", hidden=args.hidden, layers=args.layers, max_len=max(args.seq, 16))
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    if args.impl == "hf":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    else:
        model.enable_input_require_grads()  # the reentrant variant needs an input that requires grad
        impl = CheckpointImpl.REENTRANT if args.impl == "reentrant" else CheckpointImpl.NO_REENTRANT
        apply_activation_checkpointing(
            model,
            checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=impl),
            check_fn=lambda m: isinstance(m, LlamaDecoderLayer),
        )
    model = FullyShardedDataParallel(
        model,
        device_id=torch.device("cpu"),
        use_orig_params=True,  # frozen base and trainable adapters share the units
        auto_wrap_policy=functools.partial(
            transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer}
        ),
    )
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    out = Path(f"{args.losses}.rank{rank}").open("w") if args.losses is not None else None  # noqa: SIM115
    gen = torch.Generator().manual_seed(1000 + rank)
    for _ in range(args.steps):
        batch = torch.randint(3, 500, (args.batch, args.seq), generator=gen)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if out is not None:  # each step as it ends: pitstop doctor stops the job after its window
            print(repr(loss.item()), file=out, flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
