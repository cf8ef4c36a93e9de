"""The nccl backend for GPU tensors (gloo copies every collective through host memory)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, register


@register
class NcclBackend(Remedy):
    id = RemedyId.NCCL_BACKEND
    title = "nccl for GPU tensors"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        text = "Use the nccl backend for GPU tensors: gloo copies every collective through host memory."
        if framework is Framework.ACCELERATE:
            return Advice(
                text, "# accelerate picks nccl on GPUs: check ACCELERATE_* / the launch config's backend"
            )
        return Advice(text, 'torch.distributed.init_process_group("nccl")')

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.PYTORCH, Framework.ACCELERATE)
