"""Expandable segments for the CUDA caching allocator: segments grow in place instead of new cudaMalloc blocks,
so freed memory is reused instead of fragmenting; or less memory per micro-batch."""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, TrialFacts, code, register
from pitstop.trials.request import FixReport, FixRequest

SETTING = "expandable_segments:True"
ENV_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")  # the second is torch ≥ 2.9's name


@register
class ExpandableSegments(Remedy):
    id = RemedyId.EXPANDABLE_SEGMENTS
    title = "expandable allocator segments"
    tune_rank = 180
    effect = "same math, another allocator layout"
    tunable = True

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``near_full``: memory is nearly full, so a smaller micro-batch (with accumulation) is the other way."""
        text = (
            f"Start the job with PYTORCH_CUDA_ALLOC_CONF={SETTING}: the allocator grows its segments instead of "
            "allocating and freeing new blocks"
            + (
                "; memory is nearly full, so halving the micro-batch and doubling gradient accumulation also works"
                if params.get("near_full")
                else ""
            )
            + ". Do not call torch.cuda.empty_cache() inside the training loop."
        )
        launch = f"PYTORCH_CUDA_ALLOC_CONF={SETTING} "
        if framework.is_trainer:
            return Advice(
                text,
                code(f"""
                    {launch}python train.py
                    # or: args = {framework.args_class}(..., per_device_train_batch_size=B // 2, gradient_accumulation_steps=2 * A)
                """),
            )
        return Advice(text, f"{launch}python train.py  # or torchrun ...; set before CUDA starts")

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.PYTORCH)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return None if facts.on_gpu else "the CUDA allocator's setting: a GPU run only"

    def on_import(self) -> Mapping[str, Any]:
        return {"torch": self._configure}

    def _configure(self, torch: ModuleType, request: FixRequest, report: FixReport) -> None:
        """Before CUDA starts, the environment variable (read when the allocator starts); after, torch's
        runtime setter."""
        current = ",".join(os.environ.get(v, "") for v in ENV_VARS)
        if "expandable_segments:true" in current.lower():
            report.skip(self.id, "the job sets expandable_segments already")
            return
        if not torch.cuda.is_initialized():
            existing = os.environ.get(ENV_VARS[0])
            os.environ[ENV_VARS[0]] = f"{existing},{SETTING}" if existing else SETTING
            report.apply(self.id, f"{ENV_VARS[0]}={os.environ[ENV_VARS[0]]}")
            return
        torch.cuda.memory._set_allocator_settings(SETTING)
        report.apply(self.id, f"torch.cuda.memory._set_allocator_settings({SETTING!r})")
