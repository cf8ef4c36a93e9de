"""One process per GPU, so no GPU of the job sits idle."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, register


@register
class UseEveryGpu(Remedy):
    id = RemedyId.USE_EVERY_GPU
    title = "one process per GPU"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``idle``: the GPUs that did no work."""
        idle = ", ".join(str(i) for i in params.get("idle") or ())
        text = (
            f"GPU {idle} did no work. Launch one process per GPU (torchrun --nproc_per_node / "
            "accelerate launch --num_processes) and check CUDA_VISIBLE_DEVICES and device placement."
        )
        if framework.is_trainer or framework is Framework.ACCELERATE:
            return Advice(text, "accelerate launch --num_processes $(nvidia-smi -L | wc -l) train.py")
        return Advice(text, "torchrun --nproc_per_node $(nvidia-smi -L | wc -l) train.py")

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.PYTORCH)
