"""Collect garbage by hand: freeze what setup built, switch automatic collection off, collect the young
generations every N steps, so the collector's pause is short and lands where the loop puts it.

Not tunable: tune could apply it from outside (at the first optimizer step: ``gc.freeze()``, ``gc.disable()``
and an optimizer-step hook that calls ``gc.collect(1)``), but that is not wired into its trials yet, and a
job that builds long-lived objects after its first step would freeze too early.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.remedies.base import Advice, Remedy, code, register
from pitstop.vocabulary import CauseId, Framework, RemedyId

EVERY = 50  # steps between manual young-generation collections: often enough that young objects stay few


@register
class ManualGc(Remedy):
    id = RemedyId.MANUAL_GC
    title = "collect garbage by hand"
    causes = (CauseId.GC_PAUSES,)
    effect = "same training; the collector runs only where the loop calls it"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``enabled``: automatic collection was on in the window; ``young_only``: no full collection ran."""
        if params.get("young_only"):
            text = (
                "The collector's time here is young-generation work, which no schedule removes: every step the "
                "job makes Python objects in reference cycles (or many that outlive the step). Break the cycles "
                "(weakref, clear the references) or keep fewer Python objects per step."
            )
            return Advice(text, self._snippet(framework))
        text = (
            (
                "The job already collects by hand, but full collections still run: call gc.collect(1) (the "
                "young generations only) rather than gc.collect(), and gc.freeze() what setup built."
                if params.get("enabled") is False
                else "Take full collections out of the step: gc.disable() after setup and gc.collect(1) every "
                f"{EVERY} steps or so (the young generations only: a short pause where the loop puts it), with "
                "gc.freeze() first so an occasional full gc.collect() skips what setup built. gc.freeze() alone "
                "shortens each full collection, but CPython then runs them more often and the total barely moves."
            )
            + " A full gc.collect() at checkpoints or evaluations frees the cyclic garbage that grew old; in a "
            "multi-process job every rank collects at the same step, so none waits for another's pause."
        )
        return Advice(text, self._snippet(framework))

    def _snippet(self, framework: Framework) -> str:
        if framework.is_trainer:
            return code(f"""
                class ManualGc(TrainerCallback):  # from transformers import TrainerCallback
                    def on_train_begin(self, args, state, control, **kwargs):
                        gc.freeze(); gc.disable()  # the dataset and the model leave every collection
                    def on_step_end(self, args, state, control, **kwargs):
                        if state.global_step % {EVERY} == 0:
                            gc.collect(1)  # young generations only: a short pause at a known step
                    def on_train_end(self, args, state, control, **kwargs):
                        gc.enable(); gc.unfreeze()

                trainer = {"SFTTrainer" if framework is Framework.TRL else "Trainer"}(..., callbacks=[ManualGc()])
            """)
        if framework is Framework.LIGHTNING:
            return code(f"""
                class ManualGc(L.Callback):
                    def on_train_start(self, trainer, pl_module):
                        gc.freeze(); gc.disable()  # the dataset and the model leave every collection
                    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                        if batch_idx % {EVERY} == 0:
                            gc.collect(1)  # young generations only: a short pause at a known step
                    def on_train_end(self, trainer, pl_module):
                        gc.enable(); gc.unfreeze()

                L.Trainer(..., callbacks=[ManualGc()])
            """)
        prepare = (
            "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            if framework is Framework.ACCELERATE
            else ""
        )
        return prepare + code(f"""
            gc.freeze(); gc.disable()  # after setup: the dataset and the model leave every collection
            for step, batch in enumerate(loader):
                ...
                if step % {EVERY} == 0:
                    gc.collect(1)  # young generations only, at the same step on every rank
        """)

    def frameworks(self) -> tuple[Framework, ...]:
        return (
            Framework.PYTORCH,
            Framework.HF_TRAINER,
            Framework.TRL,
            Framework.LIGHTNING,
            Framework.ACCELERATE,
        )
