"""Fewer, larger gradient buckets: each all-reduce's fixed latency paid fewer times per step."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, register


@register
class BiggerBuckets(Remedy):
    id = RemedyId.BIGGER_BUCKETS
    title = "larger gradient buckets"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``bucket_mb``: the bucket size to use; ``per_step`` / ``mb_per_call``: what was measured."""
        mb = int(params.get("bucket_mb") or 100)
        seen = ""
        if params.get("per_step") and params.get("mb_per_call") is not None:
            seen = f" ({params['per_step']:.0f} collectives per step of {params['mb_per_call']:.2f} MB each)"
        text = (
            f"Use larger gradient buckets (bucket_cap_mb={mb}) so DDP issues fewer, larger all-reduces{seen}."
        )
        snippets = {
            Framework.HF_TRAINER: f"args = TrainingArguments(..., ddp_bucket_cap_mb={mb})",
            Framework.TRL: f"config = SFTConfig(..., ddp_bucket_cap_mb={mb})",
            Framework.ACCELERATE: "from accelerate import DistributedDataParallelKwargs\n"
            f"accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(bucket_cap_mb={mb})])",
            Framework.LIGHTNING: f"L.Trainer(..., strategy=DDPStrategy(bucket_cap_mb={mb}))",
            Framework.DEEPSPEED: '"zero_optimization": {"reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8, '
            '"overlap_comm": true}',
        }
        return Advice(
            text, snippets.get(framework, f"model = DistributedDataParallel(model, bucket_cap_mb={mb})")
        )
