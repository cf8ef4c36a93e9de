"""Activation checkpointing off where memory allows: no forward recomputed inside the backward."""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from pitstop.remedies.base import Advice, Remedy, RemedyId, TrialFacts, register
from pitstop.trials.request import FixReport, FixRequest
from pitstop.vocabulary import Framework

_ENABLERS = ("gradient_checkpointing_enable", "activation_checkpointing_enable")  # renamed in transformers 5


@register
class NoCheckpointing(Remedy):
    id = RemedyId.NO_CHECKPOINTING
    title = "activation checkpointing off"
    causes = ("needless_recompute",)
    effect = "same math, no recomputation"
    tunable = True

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``basis``: why memory allows it (the planner's figures, a measured peak)."""
        basis = params.get("basis")
        text = "Turn activation checkpointing off" + (f": {basis}." if basis else ": memory allows it.")
        if framework.is_trainer:
            return Advice(
                text,
                f"args = {framework.args_class}(..., gradient_checkpointing=False)  # activation_checkpointing in transformers 5",
            )
        if framework is Framework.LIGHTNING:
            return Advice(text, "# in configure_model(): drop model.gradient_checkpointing_enable()")
        return Advice(
            text,
            "model.gradient_checkpointing_disable()  # or remove gradient_checkpointing_enable(); selective checkpointing keeps some",
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.LIGHTNING, Framework.PYTORCH)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return None

    def on_import(self) -> Mapping[str, Any]:
        return {"transformers.modeling_utils": self._patch_models}

    def _patch_models(self, modeling_utils: ModuleType, request: FixRequest, report: FixReport) -> None:
        """Checkpointing requests on any transformers model become no-ops."""
        model_class = modeling_utils.PreTrainedModel
        for name in _ENABLERS:
            if hasattr(model_class, name):

                def skipped(model: Any, *args: Any, _name: str = name, **kwargs: Any) -> None:
                    report.apply(self.id, f"{_name}() on {type(model).__name__} skipped")

                setattr(model_class, name, skipped)

    def rewrite_training_args(self, args: Any, request: FixRequest, report: FixReport) -> None:
        for name in ("gradient_checkpointing", "activation_checkpointing"):  # renamed in transformers 5
            if getattr(args, name, False):
                setattr(args, name, False)
                report.apply(self.id, f"TrainingArguments({name}=False)")
