"""TF32 for the fp32 matrix math that remains: tensor cores at ~8x the plain fp32 rate on Ampere and later.

The trial switches it on at the first forward (never at import: asking ``torch.cuda.is_available()`` then
initializes CUDA, which breaks jobs that pick devices or fork afterwards), with the API the job uses — the
``fp32_precision`` properties when the job set them, the legacy ``allow_tf32`` flags otherwise (torch refuses
a mix of the two on every GEMM) — and checks at the first optimizer step that the job has not set it back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework
from pitstop.remedies.base import (
    Advice,
    Remedy,
    RemedyId,
    TrialFacts,
    at_first_optimizer_step,
    code,
    register,
)
from pitstop.trials.request import FixReport, FixRequest


def _uses_new_api(torch: Any) -> bool:
    """Whether the job set the ``fp32_precision`` properties (then only they may be used)."""
    matmul = torch.backends.cuda.matmul
    return getattr(matmul, "fp32_precision", "none") not in ("none", None)


def tf32_in_effect(torch: Any, new_api: bool) -> bool | None:
    """Whether TF32 matmuls are on, read with the API that set them; None when torch refuses to say."""
    try:
        if new_api:
            return bool(torch.backends.cuda.matmul.fp32_precision == "tf32")
        return bool(torch.backends.cuda.matmul.allow_tf32)
    except RuntimeError:  # the job switched API after pitstop: torch refuses the mix
        return None


@register
class Tf32(Remedy):
    id = RemedyId.TF32
    title = "TF32 matrix math"
    tune_rank = 110
    effect = "same math at TF32 precision"
    tunable = True

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        text = "Allow TF32 for the fp32 matrix math (Ampere and later GPUs)."
        if framework.is_trainer:
            return Advice(text, f"args = {framework.args_class}(..., tf32=True)")
        return Advice(
            text,
            code("""
                torch.backends.cuda.matmul.fp32_precision = "tf32"   # torch >= 2.9; before: .allow_tf32 = True
                torch.backends.cudnn.conv.fp32_precision = "tf32"  # type: ignore[attr-defined]
            """),
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.PYTORCH)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        if not facts.on_gpu:
            return "TF32 is a GPU feature"
        if facts.gpu_has_tf32 is False:
            return "this GPU has no TF32 tensor cores (before Ampere): TF32 would change nothing"
        return None

    def on_first_forward(self, model: Any, request: FixRequest, report: FixReport) -> None:
        import torch

        device = next((p.device.type for p in model.parameters()), "cpu")
        if device != "cuda":
            report.skip(self.id, f"the model runs on {device}, not a CUDA GPU")
            return
        new_api = _uses_new_api(torch)
        if new_api:
            torch.backends.cuda.matmul.fp32_precision = "tf32"
            torch.backends.cudnn.conv.fp32_precision = "tf32"  # type: ignore[attr-defined]
            how = 'torch.backends.cuda.matmul.fp32_precision = "tf32" (the API the job uses)'
        else:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            how = "torch.backends.cuda.matmul.allow_tf32 = True; cudnn.allow_tf32 = True"
        report.apply(self.id, how)

        def check() -> None:
            state = tf32_in_effect(torch, new_api)
            if state is False:
                report.revoke(self.id, "the job set fp32 matmul precision back after pitstop enabled TF32")
            elif state is None:
                report.revoke(
                    self.id, "the job switched TF32 APIs after pitstop enabled it (torch refuses the mix)"
                )

        at_first_optimizer_step(check)
