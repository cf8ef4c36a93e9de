"""Fused kernels where the GPU is busy with little model math: fused optimizer, torch.compile."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, code, register


@register
class FusedKernels(Remedy):
    id = RemedyId.FUSED_KERNELS
    title = "fused optimizer and compiled model"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        text = (
            "The GPU is busy but does little model math per second. Look at the kernels (a torch.profiler trace): "
            "small or fp32 GEMMs, unfused optimizer and loss, memory-bound elementwise ops. Common wins: a fused "
            "optimizer, torch.compile, fused cross-entropy, a larger micro-batch."
        )
        if framework.is_trainer:
            return Advice(
                text, f'args = {framework.args_class}(..., optim="adamw_torch_fused", torch_compile=True)'
            )
        if framework is Framework.LIGHTNING:
            return Advice(
                text,
                "model = torch.compile(model)  # and torch.optim.AdamW(..., fused=True) in configure_optimizers",
            )
        return Advice(
            text,
            code("""
                opt = torch.optim.AdamW(model.parameters(), lr=..., fused=True)
                model = torch.compile(model)
            """),
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.LIGHTNING, Framework.PYTORCH)
