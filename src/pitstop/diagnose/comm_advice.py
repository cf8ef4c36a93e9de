"""What to change when communication or a straggler limits a multi-rank run: text and snippets per framework.

Plain functions returning ``{"text": str, "snippets": {framework: code}}``; the remedies package takes them
over (the rules do not build their fix from these yet, they put the advice ids in their evidence).
"""

from __future__ import annotations

from typing import Any

Advice = dict[str, Any]


def bigger_buckets(bucket_mb: int = 100) -> Advice:
    """Many small collectives: fewer, larger gradient buckets amortise each all-reduce's latency."""
    return {
        "text": f"Use larger gradient buckets (bucket_cap_mb={bucket_mb}) so DDP issues fewer, larger all-reduces.",
        "snippets": {
            "pytorch": f"model = DistributedDataParallel(model, bucket_cap_mb={bucket_mb})",
            "hf_trainer": f"TrainingArguments(..., ddp_bucket_cap_mb={bucket_mb})",
            "trl": f"SFTConfig(..., ddp_bucket_cap_mb={bucket_mb})",
            "accelerate": (
                "from accelerate import DistributedDataParallelKwargs\n"
                f"Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(bucket_cap_mb={bucket_mb})])"
            ),
            "deepspeed": '"zero_optimization": {"reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8, '
            '"overlap_comm": true}',
        },
    }


def no_sync_accumulation() -> Advice:
    """Gradient accumulation that all-reduces every micro-step moves the gradients k times per step."""
    return {
        "text": "Skip the gradient all-reduce on accumulation micro-steps (only the last one needs it).",
        "snippets": {
            "pytorch": (
                "ctx = model.no_sync() if (i + 1) % accum != 0 else contextlib.nullcontext()\n"
                "with ctx:\n    loss.backward()"
            ),
            "accelerate": "with accelerator.accumulate(model):\n    accelerator.backward(loss)",
            "hf_trainer": "# the Trainer already syncs only on the last micro-step; check a custom training_step",
        },
    }


def transport(warnings: list[str], multi_node: bool) -> Advice:
    """The bandwidth is far below the link: the transport NCCL fell back to, and how to undo it."""
    lines = [
        "unset NCCL_IB_DISABLE NCCL_P2P_DISABLE   # let NCCL use InfiniBand / NVLink",
        "export NCCL_DEBUG=INFO",
    ]
    if multi_node:
        lines.append(
            "export NCCL_SOCKET_IFNAME=<the fast interface, e.g. ib0 or ens*>  # not the management NIC"
        )
    return {
        "text": "Communication runs far below the link: "
        + ("; ".join(warnings) if warnings else "check which transport NCCL chose (NCCL_DEBUG=INFO)")
        + ".",
        "snippets": {"shell": "\n".join(lines)},
    }


def nccl_backend() -> Advice:
    """gloo for CUDA tensors copies every collective through host memory."""
    return {
        "text": "Use the nccl backend for GPU tensors.",
        "snippets": {"pytorch": 'torch.distributed.init_process_group("nccl")'},
    }


def straggler_compute(rank: int) -> Advice:
    """A rank computes slower than its peers: its device or its share of the work differs."""
    return {
        "text": f"Rank {rank} computes slower than its peers: check its GPU's clocks and temperature "
        "(nvidia-smi -q -d PERFORMANCE), other processes on it, and whether its batches are longer "
        "(group by length / pack so every rank gets equal work).",
        "snippets": {"shell": "nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER"},
    }


ADVICE = {
    "bigger_buckets": bigger_buckets,
    "no_sync_accumulation": no_sync_accumulation,
    "transport": transport,
    "nccl_backend": nccl_backend,
    "straggler_compute": straggler_compute,
}
