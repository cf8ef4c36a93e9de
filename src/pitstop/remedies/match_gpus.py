"""Run a data-parallel job on one GPU model: the slower cards left out (``CUDA_VISIBLE_DEVICES``, the
launcher's device list) or given a job of their own.

DDP, FSDP, DeepSpeed, Accelerate, Lightning and the Trainer all give every rank the same micro-batch, and none
of them splits work by a card's speed; a hand-written loop could give the slow ranks smaller micro-batches (with
the loss weighted by each rank's tokens), which is rarely worth its bugs. Leaving cards out changes the global
batch (fewer ranks), so the advice says to raise gradient accumulation to keep it. Not something tune can try:
the devices a job runs on are chosen when it is launched."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, code, register


@register
class MatchGpus(Remedy):
    id = RemedyId.MATCH_GPUS
    title = "run on one GPU model"
    effect = "fewer or other cards; the same training where the global batch is kept"
    preserves_computation = False  # fewer ranks: the global batch changes unless accumulation makes it up

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``slow_model``, ``slow_ranks`` (e.g. "ranks 6-7"), ``fast_model``: the cards; ``fast_ranks`` and
        ``world_size``: how many ranks are on the faster cards and in all; ``fast_devices``: their local device
        indices ("0,1,2,3,4,5") on a one-machine job; ``fast_only_ratio``: the measured throughput on the faster
        cards alone over today's; ``models``: every model and its ranks, when which is slower is not known."""
        slow, fast = params.get("slow_model"), params.get("fast_model")
        slow_ranks, models = params.get("slow_ranks"), params.get("models")
        n_fast, world = params.get("fast_ranks"), params.get("world_size")
        ratio = params.get("fast_only_ratio")
        if slow:
            who = f"{slow_ranks} on {slow}" if slow_ranks else f"the {slow} cards"
            sets = "sets" if str(slow_ranks).startswith("rank ") else "set"
            elsewhere = f" ({fast} elsewhere)" if fast else ""
            head = f"Run the job on one GPU model: {who} {sets} the pace of every rank{elsewhere}."
        else:
            head = (
                f"Run the job on one GPU model ({models or 'the ranks name different cards'}); time one step on "
                "each kind alone to see which card is slower."
            )
        keep = (
            f"Leave the slower cards out and launch one process per faster card ({n_fast} of {world})"
            if n_fast and world
            else "Leave the slower cards out and launch one process per remaining card"
        )
        gain = ""
        if isinstance(ratio, int | float):
            gain = (
                f": measured, that alone gives ×{ratio:.2f} the throughput"
                if ratio >= 1.0
                else f": measured, that alone gives only ×{ratio:.2f} the throughput, so fewer cards lose more than "
                "the wait; swap the slow cards for the faster model or run them as a separate job instead"
            )
        text = (
            f"{head} {keep}{gain}; raise gradient accumulation by the ratio of the ranks to keep the global "
            "batch. Or give the slow cards a job of their own (an evaluation, another run). The frameworks do "
            "not split work by speed: DDP, FSDP, DeepSpeed, Accelerate, Lightning and the Trainer give every rank "
            "the same micro-batch; only a hand-written loop can give the slow ranks smaller micro-batches "
            "(weighting each rank's loss by its tokens)."
        )
        return Advice(text, self._snippet(framework, params.get("fast_devices"), n_fast))

    def _snippet(self, framework: Framework, devices: object, n_fast: object) -> str:
        visible = str(devices) if devices else "<the faster cards' indices: nvidia-smi -L>"
        count = str(n_fast) if n_fast else "<their number>"
        if framework is Framework.DEEPSPEED:
            listed = str(devices) if devices else "<the faster cards' indices>"
            return f"deepspeed --include localhost:{listed} train.py ...  # the faster cards only"
        if framework is Framework.ACCELERATE:
            return f"CUDA_VISIBLE_DEVICES={visible} accelerate launch --num_processes {count} train.py ..."
        if framework is Framework.LIGHTNING:
            listed = f"[{devices}]" if devices else "[<the faster cards' indices>]"
            return code(f"""
                trainer = L.Trainer(..., accelerator="gpu", devices={listed},
                                    accumulate_grad_batches=...)  # scaled up to keep the global batch
            """)
        if framework.is_trainer:
            return code(f"""
                # CUDA_VISIBLE_DEVICES={visible} torchrun --nproc_per_node {count} train.py ...
                args = {framework.args_class}(..., gradient_accumulation_steps=...)  # scaled up to keep the global batch
            """)
        return f"CUDA_VISIBLE_DEVICES={visible} torchrun --nproc_per_node {count} train.py ...  # the faster cards only"

    def frameworks(self) -> tuple[Framework, ...]:
        return (
            Framework.PYTORCH,
            Framework.HF_TRAINER,
            Framework.TRL,
            Framework.ACCELERATE,
            Framework.LIGHTNING,
            Framework.DEEPSPEED,
        )
