"""Hide gradient communication behind the backward pass."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, register


@register
class OverlapComm(Remedy):
    id = RemedyId.OVERLAP_COMM
    title = "overlapped, bucketed gradient communication"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``zero_stage``: the DeepSpeed stage when one is configured."""
        text = (
            "Hide gradient communication behind the backward pass: bigger gradient buckets, overlapping "
            "reduce-scatter, fewer and larger collectives; across nodes, check the interconnect first."
        )
        if framework is Framework.DEEPSPEED:
            if params.get("zero_stage") == 3:
                return Advice(
                    text,
                    '"zero_optimization": {"stage": 3, "overlap_comm": true, "stage3_prefetch_bucket_size": 5e8}',
                )
            return Advice(
                text,
                '"zero_optimization": {"overlap_comm": true, "reduce_bucket_size": 5e8, "contiguous_gradients": true}',
            )
        snippets = {
            Framework.HF_TRAINER: "args = TrainingArguments(..., ddp_bucket_cap_mb=100)  # or overlap_comm in the ds_config",
            Framework.TRL: "config = SFTConfig(..., ddp_bucket_cap_mb=100)",
            Framework.ACCELERATE: "DistributedDataParallelKwargs(bucket_cap_mb=100, gradient_as_bucket_view=True)",
            Framework.LIGHTNING: "L.Trainer(..., strategy=DDPStrategy(bucket_cap_mb=100, gradient_as_bucket_view=True))",
        }
        pytorch = "model = DDP(model, bucket_cap_mb=100, gradient_as_bucket_view=True, static_graph=True)"
        return Advice(text, snippets.get(framework, pytorch))
