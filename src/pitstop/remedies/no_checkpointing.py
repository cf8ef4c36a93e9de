"""Activation checkpointing off where memory allows: no forward recomputed inside the backward.

A trial verifies that it is off before its window counts (issue 27, item 4): every call into
``torch.utils.checkpoint`` (reentrant or not) is counted up to the first optimizer step; a checkpointed call
there, or a torch whose checkpoint functions cannot be counted, revokes the fix ("not applied"), since a window
that still recomputes would otherwise be judged as if checkpointing were off.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, TrialFacts, at_first_optimizer_step, register
from pitstop.trials.request import FixReport, FixRequest

_ENABLERS = ("gradient_checkpointing_enable", "activation_checkpointing_enable")  # renamed in transformers 5


@register
class NoCheckpointing(Remedy):
    id = RemedyId.NO_CHECKPOINTING
    title = "activation checkpointing off"
    tune_rank = 120
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
        return {"transformers.modeling_utils": self._patch_models, "torch.utils.checkpoint": self._verify_off}

    def _verify_off(self, checkpoint: ModuleType, request: FixRequest, report: FixReport) -> None:
        """Count the checkpointed calls up to the first optimizer step, then say whether it was off."""
        calls = checkpoint_counter(checkpoint)

        def check() -> None:
            verdict = off_or_why(calls, self.id in report.applied)
            if verdict is not None:
                if self.id in report.applied:
                    report.revoke(self.id, verdict)
                else:
                    report.skip(self.id, verdict)

        at_first_optimizer_step(check)

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


def checkpoint_counter(checkpoint: ModuleType) -> list[int]:
    """Wrap the two ways ``torch.utils.checkpoint`` recomputes (the reentrant ``CheckpointFunction`` and the
    non-reentrant generator ``checkpoint()`` calls by name) to count their calls. Returns ``[calls]``, or
    ``[-1]`` when this torch has neither (nothing can be verified)."""
    calls = [0]
    function = getattr(checkpoint, "CheckpointFunction", None)
    generator = getattr(checkpoint, "_checkpoint_without_reentrant_generator", None)
    if function is None or generator is None or not callable(getattr(function, "forward", None)):
        calls[0] = -1
        return calls
    forward = function.forward

    def counted_forward(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return forward(*args, **kwargs)

    def counted_generator(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return generator(*args, **kwargs)

    function.forward = staticmethod(counted_forward)
    checkpoint._checkpoint_without_reentrant_generator = counted_generator  # type: ignore[attr-defined]
    return calls


def off_or_why(calls: list[int], applied: bool) -> str | None:
    """None when checkpointing was verified off up to the first optimizer step, else why it was not."""
    if calls[0] < 0:
        return "could not verify that checkpointing was off (this torch's checkpoint functions are not countable)"
    if calls[0] == 0:
        return None
    if applied:
        return (
            f"checkpointing still ran ({calls[0]} checkpointed calls before the first optimizer step): the job "
            "enables it some other way than gradient_checkpointing_enable() or the Trainer's argument"
        )
    return (
        f"the job checkpoints through torch.utils.checkpoint directly ({calls[0]} calls before the first "
        "optimizer step), which tune cannot turn off from outside"
    )
