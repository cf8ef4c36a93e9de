"""Activation checkpointing's non-reentrant variant (``use_reentrant=False``): the same recompute, run under the
backward's own bookkeeping, so an FSDP unit inside a checkpoint is all-gathered once in the backward, not twice.
Same math: both variants run the same operations and restore the same RNG state.

A trial makes every checkpointed call non-reentrant where torch takes the choice: ``torch.utils.checkpoint.
checkpoint`` is wrapped as torch finishes importing it (before Transformers, FSDP's ``checkpoint_wrapper`` or
the job bind it), and a call that asks for the reentrant variant or leaves it to torch's default runs the
other; a Trainer's ``gradient_checkpointing_kwargs`` say so too. The reentrant runs are counted up to the first
optimizer step: one that still ran (``CheckpointFunction`` called directly) revokes the fix."""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, TrialFacts, at_first_optimizer_step, code, register
from pitstop.trials.request import FixReport, FixRequest

# the Trainer's checkpointing settings, the new name first (transformers 5 keeps the old as an alias)
KWARGS = ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs")
SWITCHES = ("activation_checkpointing", "gradient_checkpointing")


def requested_by(site: str | None) -> str | None:
    """What the job wrote that asked for the reentrant variant, from the line that called checkpoint()."""
    if not site:
        return None
    if "checkpoint_wrapper.py" in site:
        return "checkpoint_wrapper(..., checkpoint_impl=CheckpointImpl.REENTRANT)"
    if site.startswith("transformers/"):
        return "Transformers' gradient checkpointing with use_reentrant=True"
    return f"the checkpoint() call at {site}"


@register
class NonReentrantCheckpointing(Remedy):
    id = RemedyId.NON_REENTRANT_CHECKPOINTING
    title = "non-reentrant activation checkpointing"
    effect = "same math, one all-gather per FSDP unit in the backward"
    tune_rank = 125
    tunable = True
    exclusive_with = (RemedyId.NO_CHECKPOINTING,)  # with checkpointing off there is no variant to choose

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``site``: the line that called checkpoint() for a reentrant call; ``needless``: checkpointing
        itself was found not needed (needless_recompute), the bigger fix."""
        asked = requested_by(params.get("site"))
        text = (
            "Checkpoint with the non-reentrant variant (use_reentrant=False)"
            + (f" instead of {asked}" if asked else "")
            + ": it recomputes each layer under the backward's own all-gather of its FSDP unit, where the "
            "reentrant variant gathers the unit a second time."
        )
        if params.get("needless"):
            text += (
                " Where memory allows, turning activation checkpointing off altogether (the finding on "
                "recomputed activations) is the bigger fix and makes this one moot."
            )
        return Advice(text, self._snippet(framework))

    def _snippet(self, framework: Framework) -> str:
        if framework.is_trainer:
            return code(f"""
                args = {framework.args_class}(..., gradient_checkpointing=True,
                                         gradient_checkpointing_kwargs={{"use_reentrant": False}})
                # transformers 5: activation_checkpointing_kwargs; with FSDP, fsdp_config={{"activation_checkpointing": True}}
            """)
        if framework is Framework.LIGHTNING:
            return code("""
                strategy = FSDPStrategy(activation_checkpointing_policy={Block})   # non-reentrant, inside each unit
                # by hand: torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            """)
        return code("""
            checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT)   # or apply it after FSDP wraps
            torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        """)

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.LIGHTNING, Framework.PYTORCH)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return None

    # -- trial hooks ----------------------------------------------------------------------------------
    def on_import(self) -> Mapping[str, Any]:
        return {"torch.utils.checkpoint": self._patch_checkpoint}

    def _patch_checkpoint(self, checkpoint: ModuleType, request: FixRequest, report: FixReport) -> None:
        """Every checkpoint() call runs non-reentrant; count the reentrant runs left up to the first step."""
        import torch  # partly initialized: torch imports this module on its way in

        original = checkpoint.checkpoint
        forced = [0]

        def compiling() -> bool:
            return bool(torch.compiler.is_compiling())

        def non_reentrant(function: Any, *args: Any, use_reentrant: bool | None = None, **kwargs: Any) -> Any:
            # under torch.compile the checkpoint is traced as the non-reentrant variant anyway
            if use_reentrant is not False and not compiling():
                forced[0] += 1
                if forced[0] == 1:
                    asked = "use_reentrant=True" if use_reentrant else "use_reentrant left to torch's default"
                    report.apply(
                        self.id, f"torch.utils.checkpoint.checkpoint: {asked} run as use_reentrant=False"
                    )
            return original(function, *args, use_reentrant=False, **kwargs)

        non_reentrant.__wrapped__ = original  # type: ignore[attr-defined]
        checkpoint.checkpoint = non_reentrant  # type: ignore[attr-defined]
        reentrant = _reentrant_counter(checkpoint)

        def check() -> None:
            if reentrant[0] < 0:
                report.skip(
                    self.id, "could not verify the variant (this torch's CheckpointFunction is not countable)"
                )
            elif reentrant[0] > 0:
                why = (
                    f"{reentrant[0]} checkpointed calls still ran reentrant before the first optimizer step "
                    "(the job calls CheckpointFunction directly)"
                )
                (report.revoke if self.id in report.applied else report.skip)(self.id, why)
            elif forced[0] == 0:
                report.skip(self.id, "no reentrant checkpoint call before the first optimizer step")

        at_first_optimizer_step(check)

    def rewrite_training_args(self, args: Any, request: FixRequest, report: FixReport) -> None:
        if not any(getattr(args, name, False) for name in SWITCHES):
            return
        name = next((n for n in KWARGS if getattr(args, n, None) is not None), None)
        name = name or next((n for n in KWARGS if hasattr(args, n)), None)
        if name is None:  # a transformers without the setting: the checkpoint() wrapper still applies
            return
        value = getattr(args, name, None)
        if isinstance(value, str) and value.lstrip().startswith("{"):
            try:
                value = json.loads(value)
            except ValueError:
                return  # the Trainer will refuse it itself
        kwargs = dict(value) if isinstance(value, Mapping) else {}
        if kwargs.get("use_reentrant") is False:
            return
        kwargs["use_reentrant"] = False
        setattr(args, name, kwargs)
        report.apply(self.id, f'TrainingArguments({name}={{"use_reentrant": False}})')


def _reentrant_counter(checkpoint: ModuleType) -> list[int]:
    """Count the reentrant variant's runs (``CheckpointFunction.forward``); ``[-1]`` when this torch has none
    to count."""
    calls = [0]
    function = getattr(checkpoint, "CheckpointFunction", None)
    run = getattr(function, "forward", None)  # the function itself, read through the class
    if not callable(run):
        calls[0] = -1
        return calls

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return run(*args, **kwargs)

    function.forward = staticmethod(counted)  # type: ignore[union-attr]
    return calls
