"""Links that cap the job: move fewer bytes per token over them, keep the heavy traffic on the fast links, or
run on fewer GPUs per job; and, where the link itself is faulty, the check that finds it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, register

# what to check when a link runs below the machine's own (slow_links' reason -> the words)
FAULT_CHECKS = {
    "pcie_width": "a GPU's PCIe link runs fewer lanes than it has: reseat the card or move it to a full x16 slot "
    "(riser, bifurcation or BIOS lane settings); `nvidia-smi -q | grep -A2 'Link Width'` shows max and current",
    "pcie_gen": "a GPU's PCIe link runs below its generation while training: check the slot's BIOS setting "
    "(forced Gen), the riser and the card's seating; `nvidia-smi -q | grep -A2 'PCIe Generation'` under load",
    "nvlink_down": "NVLinks are down: `nvidia-smi nvlink -s` lists them <inactive>; a reset or a service "
    "ticket brings them back (NCCL routes around them at a fraction of the bandwidth)",
}
SNIPPETS = {
    Framework.HF_TRAINER: (
        "args = TrainingArguments(..., gradient_accumulation_steps=8,   # one all-reduce per 8 micro-batches\n"
        "                         ddp_bucket_cap_mb=200)\n"
        "# FSDP across nodes: fsdp='hybrid_shard auto_wrap' keeps the gathers inside the node"
    ),
    Framework.TRL: (
        "config = SFTConfig(..., gradient_accumulation_steps=8, ddp_bucket_cap_mb=200)\n"
        "# FSDP across nodes: fsdp='hybrid_shard auto_wrap' keeps the gathers inside the node"
    ),
    Framework.ACCELERATE: (
        "accelerator = Accelerator(gradient_accumulation_steps=8,   # no_sync on all but the last micro-batch\n"
        "    kwargs_handlers=[DistributedDataParallelKwargs(bucket_cap_mb=200, comm_hook=DDPCommunicationHookType.BF16)])"
    ),
    Framework.LIGHTNING: (
        "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
        "L.Trainer(..., accumulate_grad_batches=8, strategy=DDPStrategy(bucket_cap_mb=200,\n"
        "          ddp_comm_hook=default_hooks.bf16_compress_hook))"
    ),
    Framework.DEEPSPEED: (
        "# ZeRO++: hpZ keeps the backward's gathers inside the node, quantized weights and gradients\n"
        '"gradient_accumulation_steps": 8,\n'
        '"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8,\n'
        '                      "zero_quantized_weights": true, "zero_quantized_gradients": true,\n'
        '                      "reduce_bucket_size": 5e8, "overlap_comm": true}'
    ),
}
PYTORCH = (
    "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
    "model = DDP(model, bucket_cap_mb=200)\n"
    "model.register_comm_hook(None, default_hooks.bf16_compress_hook)   # half the bytes per all-reduce\n"
    "with model.no_sync(): loss.backward()                              # every micro-batch but the last\n"
    "# FSDP across nodes: ShardingStrategy.HYBRID_SHARD keeps the gathers inside the node"
)


@register
class CommunicateLess(Remedy):
    id = RemedyId.COMMUNICATE_LESS
    title = "less communication over slow links"
    preserves_computation = False  # bf16 compression and a larger effective batch change the numbers

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``reason``: slow_links' reason (a fault's name or "pcie_only"); ``busbw_gbps`` and ``link``: the
        ceiling; ``gpus``, ``nodes``: the job's."""
        busbw, link = params.get("busbw_gbps"), params.get("link")
        where = f" (~{busbw:g} GB/s bus bandwidth on {link})" if busbw and link else ""
        text = (
            f"The links cap this job{where}: move fewer bytes per token over them. Accumulate more micro-batches "
            "per optimizer step (one all-reduce per step, not per micro-batch), use bigger DDP buckets and let "
            "them overlap the backward, compress gradients to bf16 with a DDP comm hook, keep sharded gathers "
            "inside a node (FSDP HYBRID_SHARD, ZeRO++ hpZ), or run several smaller data-parallel jobs instead of "
            "one wide one; more GPUs on these links add little. A machine with NVLink (and InfiniBand between "
            "nodes) removes the limit."
        )
        check = FAULT_CHECKS.get(str(params.get("reason") or ""))
        if check:
            text = f"First the link itself: {check}. Meanwhile: " + text[0].lower() + text[1:]
        return Advice(text, SNIPPETS.get(framework, PYTORCH))
