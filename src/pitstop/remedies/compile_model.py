"""torch.compile: elementwise chains (norms, activations, rotary embeddings) fused into few kernels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, TrialFacts, register
from pitstop.trials.request import FixReport, FixRequest


@register
class CompileModel(Remedy):
    id = RemedyId.COMPILE_MODEL
    title = "torch.compile the model"
    tune_rank = 170
    effect = "same math, compiled kernels (fp order may differ)"
    tunable = True

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        text = (
            "Compile the model with torch.compile: norms, activations and rotary embeddings become a few fused "
            "kernels (the first steps pay the compilation)."
        )
        if framework.is_trainer:
            return Advice(text, f"args = {framework.args_class}(..., torch_compile=True)")
        if framework is Framework.LIGHTNING:
            return Advice(text, "model = torch.compile(model)  # before trainer.fit(model)")
        return Advice(text, "model = torch.compile(model)")

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.LIGHTNING, Framework.PYTORCH)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return None if facts.hf_model else "tune compiles Hugging Face models (at their first forward) only"

    def on_first_forward(self, model: Any, request: FixRequest, report: FixReport) -> None:
        """The first forward runs as it is (its call is already resolved); every later one is compiled."""
        import torch

        if hasattr(model, "_orig_mod") or getattr(model.forward, "_torchdynamo_orig_callable", None):
            report.skip(self.id, "the model is compiled already")
            return
        model.forward = torch.compile(model.forward)
        report.apply(self.id, f"torch.compile({type(model).__name__}.forward)")
