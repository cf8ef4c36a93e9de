"""Collect garbage by hand: freeze what setup built, switch automatic collection off, and run a full
collection every N steps, so the collector's pause skips the long-lived heap and lands where the loop puts it.

A full ``gc.collect()`` rather than ``gc.collect(1)``: the young collection promotes what survives it to the
oldest generation, and garbage that outlives one collection (anything kept across a step) would then wait for
a full collection that never comes while automatic collection is off, so memory would grow. With setup
frozen, a full collection traverses only what was made since.

Not tunable: tune could apply it from outside (at the first optimizer step: ``gc.freeze()``, ``gc.disable()``
and an optimizer-step hook that calls ``gc.collect()``), but that is not wired into its trials yet, and a
job that builds long-lived objects after its first step would freeze too early.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, code, register

EVERY = 50  # steps between manual collections: the garbage of that many steps waits in memory until then


@register
class ManualGc(Remedy):
    id = RemedyId.MANUAL_GC
    title = "collect garbage by hand"
    effect = "same training; the collector runs only where the loop calls it"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``enabled``: automatic collection was on in the window; ``young_only``: no full collection ran;
        ``frozen``: the job had frozen objects (gc.freeze())."""
        if params.get("young_only"):
            text = (
                "The collector's time here is young-generation work, which no schedule removes: every step the "
                "job makes Python objects in reference cycles (or many that outlive the step). Break the cycles "
                "(weakref, clear the references) or keep fewer Python objects per step."
            )
            return Advice(text, self._snippet(framework))
        if params.get("enabled") is False:
            text = (
                "The job already freezes what setup built and collects by hand; what its collections still take "
                "is traversing what it made since and finding the cyclic garbage its steps make: freeze later "
                "(after everything long-lived is built), collect less often, or break the cycles the step makes "
                "(weakref, clear the references)."
                if params.get("frozen")
                else "The job already collects by hand, but each collection traverses everything setup built: "
                "gc.freeze() after setup, so they traverse only what was made since."
            )
        else:
            text = (
                "Take the collector's pauses out of the step: gc.freeze() after setup (the dataset, the model and "
                "everything built before the loop leave every collection), gc.disable(), and a full gc.collect() "
                f"every {EVERY} steps or so, at the same step on every rank (none waits for another's pause). "
                "With setup frozen it traverses only what was made since, and it frees all the cyclic garbage; "
                "gc.collect(1) would not: garbage that outlives one collection moves to the oldest generation and "
                "stays, so memory grows. Collect more often if memory climbs between collections. gc.freeze() "
                "alone shortens each full collection, but CPython then runs them more often and the total barely "
                "moves."
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
                            gc.collect()  # skips the frozen setup; frees every cycle, at a known step
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
                            gc.collect()  # skips the frozen setup; frees every cycle, at a known step
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
                    gc.collect()  # skips the frozen setup; frees every cycle; same step on every rank
        """)

    def frameworks(self) -> tuple[Framework, ...]:
        return (
            Framework.PYTORCH,
            Framework.HF_TRAINER,
            Framework.TRL,
            Framework.LIGHTNING,
            Framework.ACCELERATE,
        )
