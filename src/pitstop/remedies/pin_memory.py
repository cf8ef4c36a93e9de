"""Pinned host memory and non-blocking copies, so host-to-device copies overlap compute."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, code, register


@register
class PinMemory(Remedy):
    id = RemedyId.PIN_MEMORY
    title = "pinned memory and non-blocking copies"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        text = (
            "Pin the DataLoader's host memory and copy batches with non_blocking=True: a copy from pinned "
            "memory overlaps compute only when it is non-blocking."
        )
        if framework.is_trainer:
            return Advice(text, f"args = {framework.args_class}(..., dataloader_pin_memory=True)")
        return Advice(
            text,
            code("""
                loader = DataLoader(train, ..., pin_memory=True)
                batch = {k: v.to("cuda", non_blocking=True) for k, v in batch.items()}
            """),
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.PYTORCH)
