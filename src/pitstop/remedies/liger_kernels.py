"""Liger Kernel: fused linear-cross-entropy (no full logits), RMSNorm, RoPE and SwiGLU as Triton kernels."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, TrialFacts, code, register
from pitstop.trials.request import FixReport, FixRequest


@register
class LigerKernels(Remedy):
    id = RemedyId.LIGER_KERNELS
    title = "Liger Kernel (fused loss and norms)"
    tune_rank = 160
    effect = "same loss, computed chunk by chunk without the full logits"
    tunable = True

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``installed``: whether liger_kernel is importable in the job; ``model_type``: the HF model type."""
        model_type = params.get("model_type") or "llama"
        text = (
            "Apply Liger Kernel's fused linear-cross-entropy and fused norms: the loss never builds the full "
            "logits and RMSNorm / RoPE / SwiGLU run as single kernels"
            + (
                ""
                if params.get("installed", True)
                else " (pip install liger-kernel; it needs a GPU and Triton)"
            )
            + "."
        )
        if framework.is_trainer:
            return Advice(text, f"args = {framework.args_class}(..., use_liger_kernel=True)")
        return Advice(
            text,
            code(f"""
                from liger_kernel.transformers import apply_liger_kernel_to_{model_type}
                apply_liger_kernel_to_{model_type}()  # before the model is created
            """),
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.PYTORCH)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        if not facts.on_gpu:
            return "Liger's kernels are Triton GPU kernels"
        if not facts.hf_model:
            return "Liger patches Hugging Face models only"
        if importlib.util.find_spec("liger_kernel") is None:
            return "liger_kernel is not installed"
        return None

    def on_first_forward(self, model: Any, request: FixRequest, report: FixReport) -> None:
        """Liger's own instance patcher; the first forward runs unpatched, every later one patched."""
        try:
            from liger_kernel.transformers import _apply_liger_kernel_to_instance
        except ImportError as exc:
            report.skip(self.id, f"liger_kernel cannot be imported in the job ({exc})")
            return
        _apply_liger_kernel_to_instance(model=model)
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        report.apply(
            self.id, f"Liger Kernel applied to {type(model).__name__}", installed=True, model_type=model_type
        )
