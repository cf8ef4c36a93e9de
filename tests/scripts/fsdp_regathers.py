"""Two gloo ranks train a tiny Llama under FSDP1 and FSDP2 with activation checkpointing placed four ways, each
reentrant and not; rank 0 prints (JSON) per placement and variant the all-gathers a step that pitstop's recompute
collector counts as repeated, and the all-gathers FSDP actually ran a step."""

from __future__ import annotations

import functools
import itertools
import json
import os
import socket
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))
from common import tiny_llama

STEPS = 2


def build(placement: str, reentrant: bool) -> torch.nn.Module:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    torch.manual_seed(0)
    model = tiny_llama("sdpa", hidden=64, layers=4)
    impl = CheckpointImpl.REENTRANT if reentrant else CheckpointImpl.NO_REENTRANT
    wrap = functools.partial(checkpoint_wrapper, checkpoint_impl=impl)

    def is_layer(m: torch.nn.Module) -> bool:
        return isinstance(m, LlamaDecoderLayer)

    if placement.startswith("fsdp1"):
        if "transformers" in placement:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        else:  # checkpoint_wrapper before FSDP wraps the layers: each checkpoint holds a whole unit
            apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrap, check_fn=is_layer)
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
        return FullyShardedDataParallel(model, device_id=torch.device("cpu"), auto_wrap_policy=policy)
    units = [fully_shard(layer) for layer in model.model.layers]
    if "prefetch" in placement:
        for unit, following in itertools.pairwise(units):
            unit.set_modules_to_forward_prefetch([following])
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrap, check_fn=is_layer)
    fully_shard(model)
    return model


def rank_main(rank: int, port: int) -> None:
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    import torch.distributed.fsdp._flat_param as flat_param
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as param_group

    from pitstop.probe.collectors.recompute import CheckpointCalls, RecomputeCollector
    from pitstop.probe.config import ProbeConfig
    from pitstop.probe.probe import Probe

    gathers = [0]

    def counted(original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            gathers[0] += 1
            return original(*args, **kwargs)

        return call

    handle = flat_param.FlatParamHandle
    handle._all_gather_flat_param = counted(handle._all_gather_flat_param)  # type: ignore[method-assign]
    param_group.foreach_all_gather = counted(param_group.foreach_all_gather)
    probe = Probe(ProbeConfig(announce=False))
    collector = next(c for c in probe.collectors if isinstance(c, RecomputeCollector))
    collector.install()
    probe.hooks.active = True
    seen: dict[str, dict[str, list[float]]] = {}
    batch = torch.randint(3, 500, (2, 32))
    for placement in (
        "fsdp1 around the unit",
        "fsdp1, transformers' checkpoint",
        "fsdp2 around the unit",
        "fsdp2 around the unit, forward prefetch",
    ):
        for reentrant in (True, False):
            model = build(placement, reentrant)
            opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
            model(input_ids=batch, labels=batch).loss.backward()  # FSDP's lazy set-up outside the count
            opt.step()
            opt.zero_grad()
            collector.counts, gathers[0] = CheckpointCalls(), 0
            for _ in range(STEPS):
                model(input_ids=batch, labels=batch).loss.backward()
                opt.step()
                opt.zero_grad()
            counts = [collector.counts.regathers / STEPS, gathers[0] / STEPS]
            seen.setdefault(placement, {})["reentrant" if reentrant else "non_reentrant"] = counts
    probe.hooks.remove()
    if rank == 0:
        print(json.dumps(seen))
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.spawn(rank_main, args=(free,), nprocs=2)
