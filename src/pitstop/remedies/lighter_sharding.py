"""Shard no more than memory needs: ZeRO-2 / SHARD_GRAD_OP where they fit, the hybrid across nodes.

A change of the job's sharding configuration, made before it starts: tune cannot switch it from outside.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, code, register

_WHY = {
    "zero2": "ZeRO-2 keeps the bf16 weights between forward and backward and still shards gradients and optimizer",
    "shard_grad_op": "SHARD_GRAD_OP keeps the gathered weights from forward to backward (ZeRO-2's trade)",
    "hybrid_shard_zero2": "HYBRID_SHARD_ZERO2 shards gradients and optimizer inside each node and keeps the weights",
    "hybrid_shard": "HYBRID_SHARD shards inside each node and sends only the gradient shards across nodes",
    "zero3_hpz": "ZeRO++ hpZ keeps a node-local copy of the shard, so the backward's gather stays inside the node",
}

_FSDP_WORDS = {  # target -> (HF Trainer's fsdp string, ShardingStrategy member)
    "shard_grad_op": ("shard_grad_op auto_wrap", "SHARD_GRAD_OP"),
    "hybrid_shard_zero2": ("hybrid_shard_zero2 auto_wrap", "_HYBRID_SHARD_ZERO2"),
    "hybrid_shard": ("hybrid_shard auto_wrap", "HYBRID_SHARD"),
}


def _deepspeed(target: str, g: int) -> str:
    if target == "zero3_hpz":
        return code(f"""
            "zero_optimization": {{
                "stage": 3,
                "zero_hpz_partition_size": {g}
            }}
        """)
    return '"zero_optimization": {"stage": 2, "overlap_comm": true, "contiguous_gradients": true}'


def _fsdp_pytorch(target: str, g: int) -> str:
    if target == "hybrid_shard":
        return code(f"""
            mesh = init_device_mesh("cuda", (world_size // {g}, {g}))  # (replicate across nodes, shard in a node)
            model = FSDP(model, sharding_strategy=ShardingStrategy.HYBRID_SHARD, device_mesh=mesh)
            # FSDP2: fully_shard(model, mesh=init_device_mesh("cuda", (world_size // {g}, {g}),
            #                    mesh_dim_names=("replicate", "shard")))  # HSDP
        """)
    member = _FSDP_WORDS.get(target, _FSDP_WORDS["shard_grad_op"])[1]
    return code(f"""
        model = FSDP(model, sharding_strategy=ShardingStrategy.{member})
        # FSDP2: fully_shard(block, reshard_after_forward=False) on each block (SHARD_GRAD_OP's behaviour)
    """)


@register
class LighterSharding(Remedy):
    id = RemedyId.LIGHTER_SHARDING
    title = "lighter sharding (ZeRO-2 / SHARD_GRAD_OP, or hybrid across nodes)"
    effect = "same math, fewer weight gathers; more memory per GPU"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``current`` / ``target``: plan/comm's strategy names (full_shard, zero2, shard_grad_op, hybrid_shard,
        hybrid_shard_zero2, zero3_hpz); ``deepspeed``: the run shards with DeepSpeed, not FSDP;
        ``gpus_per_node``; ``saved_s``: the planned communication it saves per step."""
        target = str(params.get("target") or ("zero2" if params.get("deepspeed") else "shard_grad_op"))
        g = int(params.get("gpus_per_node") or 8)
        deepspeed = bool(params.get("deepspeed")) or target in ("zero2", "zero3_hpz")
        saved = params.get("saved_s")
        text = (
            f"Shard no wider than memory needs: switch from {params.get('current') or 'ZeRO-3 / FULL_SHARD'} to {target}. "
            f"{_WHY.get(target, _WHY['zero2'])}"
            + (f"; about {saved} s less communication per step (planned)." if saved else ".")
        )
        return Advice(text, self._snippet(framework, target, g, deepspeed))

    def _snippet(self, framework: Framework, target: str, g: int, deepspeed: bool) -> str:
        fsdp_arg, member = _FSDP_WORDS.get(target, _FSDP_WORDS["shard_grad_op"])
        if deepspeed:
            ds = _deepspeed(target, g)
            if framework is Framework.DEEPSPEED:
                return ds
            if framework.is_trainer:
                return f"# in the ds_config.json passed as {framework.args_class}(deepspeed=...):\n" + ds
            if framework is Framework.ACCELERATE:
                if target == "zero3_hpz":
                    return "# accelerate config: deepspeed_config_file pointing at a ds_config with\n" + ds
                return "# accelerate config, deepspeed_config:\n  zero_stage: 2"
            if framework is Framework.LIGHTNING:
                return (
                    'L.Trainer(..., strategy="deepspeed_stage_2")'
                    if target == "zero2"
                    else "# ds_config:\n" + ds
                )
            return "# ds_config.json:\n" + ds
        if framework.is_trainer:
            return f'args = {framework.args_class}(..., fsdp="{fsdp_arg}")'
        if framework is Framework.ACCELERATE:
            reshard = (
                "  # FSDP2 (fsdp_version: 2): fsdp_reshard_after_forward: false"
                if target == "shard_grad_op"
                else ""
            )
            return code(f"""
                # accelerate config, fsdp_config:
                  fsdp_sharding_strategy: {member.lstrip("_")}{reshard}
                # or in code: FullyShardedDataParallelPlugin(sharding_strategy="{member.lstrip("_")}")
            """)
        if framework is Framework.LIGHTNING:
            return f'L.Trainer(..., strategy=FSDPStrategy(sharding_strategy="{member.lstrip("_")}"))'
        return _fsdp_pytorch(target, g)
