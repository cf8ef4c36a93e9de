"""Checkpoint less often, or in the background, so saving stops blocking the training loop."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, TrialFacts, code, register
from pitstop.remedies.eval_less_often import less_often
from pitstop.trials.request import FixReport, FixRequest


@register
class SaveLessOften(Remedy):
    id = RemedyId.SAVE_LESS_OFTEN
    title = "checkpoint less often"
    tune_rank = 130
    effect = "same training, fewer checkpoints"
    tunable = True

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``save_steps``: today's interval when known; ``every``: the measured steps per save."""
        save_steps = params.get("save_steps") or params.get("every")
        new = less_often(save_steps)
        text = (
            "Save checkpoints less often"
            + (
                f" (every {new} steps instead of {save_steps})"
                if new
                else " (raise save_steps; today's is not known here)"
            )
            + ", or save in the background: the training loop waits for every synchronous save."
        )
        n = new or "N"
        if framework.is_trainer:
            return Advice(
                text,
                f"args = {framework.args_class}(..., save_steps={n}, save_total_limit=2)  # save_only_model=True also skips optimizer states",
            )
        if framework is Framework.LIGHTNING:
            return Advice(
                text,
                code(f"""
                    ModelCheckpoint(every_n_train_steps={n})
                    L.Trainer(..., plugins=[AsyncCheckpointIO()])  # lightning.pytorch.plugins.io
                """),
            )
        return Advice(
            text,
            code(f"""
                import torch.distributed.checkpoint as dcp  # `import torch` alone does not load it
                if step % {n} == 0:
                    dcp.async_save(state_dict, checkpoint_id=path)  # torch >= 2.3; wait on the last before exit
            """),
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.LIGHTNING, Framework.PYTORCH)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        if not facts.framework.is_trainer:
            return "only the Trainer's save_steps can be changed from outside the job"
        return None

    def rewrite_training_args(self, args: Any, request: FixRequest, report: FixReport) -> None:
        save_steps = getattr(args, "save_steps", None)
        if str(getattr(args, "save_strategy", "steps")).lower().endswith("no"):
            report.skip(self.id, "the job saves no checkpoints (save_strategy='no')")
            return
        if isinstance(save_steps, int | float) and save_steps >= 1:
            new = less_often(int(save_steps))
            args.save_steps = new
            report.apply(self.id, f"TrainingArguments(save_steps={new})", save_steps=int(save_steps))
        else:
            report.skip(self.id, f"save_steps is {save_steps!r}, not a step count")
