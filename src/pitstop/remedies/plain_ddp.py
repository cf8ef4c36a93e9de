"""Train with plain DDP where a full replica fits: no per-unit hooks, no per-unit all-gathers and
reduce-scatters, one bucketed gradient all-reduce a step.

The same math (each rank holds the whole model and the gradients are averaged, as the sharded run's
reduce-scatter averages them), so the losses agree up to floating-point order; a sharded run that kept
fp32 master weights under a bf16 compute dtype (FSDP's ``MixedPrecision``, ZeRO's bf16 optimizer) keeps them
only if the DDP job asks for the same (autocast with fp32 parameters). It changes how the job builds its model
and its launcher's configuration before the first step: tune cannot switch it from outside."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, TrialFacts, code, register


@register
class PlainDdp(Remedy):
    id = RemedyId.PLAIN_DDP
    title = "plain DDP instead of ZeRO / FSDP (a full replica fits)"
    effect = "same math (fp32 master weights only if the DDP job keeps them); more memory per GPU"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``current``: plan/comm's name of the strategy in use; ``deepspeed``: DeepSpeed shards, not FSDP;
        ``fsdp2``: ``fully_shard`` rather than FSDP1's wrapper; ``ddp_gib``: the planner's memory per GPU
        under DDP; ``saved_ms``: the measured saving per step."""
        current = params.get("current") or ("ZeRO" if params.get("deepspeed") else "FSDP")
        gib, saved = params.get("ddp_gib"), params.get("saved_ms")
        text = (
            f"Drop the sharding ({current}) and train with plain DDP: a full replica fits"
            + (f" ({gib} GiB per GPU by the planner)" if gib is not None else "")
            + ", and DDP all-reduces the gradients in a few 25 MB buckets instead of running the sharding's "
            "hooks and a collective per unit or parameter"
            + (
                f"; about {saved} ms a step less (measured, less DDP's modelled all-reduce)."
                if saved
                else "."
            )
            + " Keep the same precision settings (the sharded run's fp32 master weights need fp32 parameters "
            "under autocast) so the losses stay the same."
        )
        return Advice(
            text, self._snippet(framework, bool(params.get("deepspeed")), bool(params.get("fsdp2")))
        )

    def _snippet(self, framework: Framework, deepspeed: bool, fsdp2: bool) -> str:
        if framework.is_trainer:
            what = "deepspeed=..." if deepspeed else 'fsdp="..." / fsdp_config=...'
            return code(f"""
                # launch with torchrun as before; the Trainer wraps the model in DDP itself
                args = {framework.args_class}(...)  # without {what}
            """) + ('\n# or keep DeepSpeed with "zero_optimization": {"stage": 0}' if deepspeed else "")
        if framework is Framework.ACCELERATE:
            return code("""
                # accelerate config (accelerate config / default_config.yaml):
                distributed_type: MULTI_GPU   # instead of DEEPSPEED / FSDP; drop deepspeed_config / fsdp_config
            """)
        if framework is Framework.LIGHTNING:
            return 'L.Trainer(..., strategy="ddp")  # instead of "deepspeed_stage_*" / FSDPStrategy(...)'
        if framework is Framework.DEEPSPEED or deepspeed:
            return code("""
                # ds_config.json: no partitioning (the engine all-reduces the gradients, as DDP does)
                "zero_optimization": {"stage": 0}
                # or without DeepSpeed: model = DistributedDataParallel(model, device_ids=[local_rank])
            """)
        undo = (
            "# instead of fully_shard(block) for each block and fully_shard(model)"
            if fsdp2
            else "# instead of model = FullyShardedDataParallel(model, ...)"
        )
        return code(f"""
            from torch.nn.parallel import DistributedDataParallel
            {undo}
            model = DistributedDataParallel(model.to(device), device_ids=[local_rank])
        """)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return (
            "the sharding is built by the job's own code or its launcher's configuration before the first step "
            "(FSDP's wrapping, the DeepSpeed engine, an accelerate config): tune cannot swap it for DDP from "
            "outside, and a swap changes the checkpoint layout the job saves"
        )
