"""Gradient accumulation that all-reduces only on the last micro-step (DDP's ``no_sync``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, code, register


@register
class NoSyncAccumulation(Remedy):
    id = RemedyId.NO_SYNC_ACCUMULATION
    title = "all-reduce once per optimizer step"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``micro_batches``: micro-steps per optimizer step, as measured."""
        k = params.get("micro_batches")
        times = f" ({k} times per step today)" if k else ""
        text = (
            "Skip the gradient all-reduce on accumulation micro-steps: only the last one needs it"
            f"{times}; the others move the gradients for nothing."
        )
        if framework is Framework.ACCELERATE:
            return Advice(text, "with accelerator.accumulate(model):\n    accelerator.backward(loss)")
        if framework.is_trainer:
            return Advice(
                text, "# the Trainer syncs only on the last micro-step: check a custom training_step"
            )
        return Advice(
            text,
            code("""
                ctx = model.no_sync() if (i + 1) % accum != 0 else contextlib.nullcontext()
                with ctx:
                    loss.backward()
            """),
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.PYTORCH, Framework.ACCELERATE, Framework.HF_TRAINER)
