"""Evaluate and checkpoint less often, on a smaller evaluation set."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, register


def less_often(every: int | None) -> int | None:
    """Five times rarer, and at least every 100 steps; None when today's interval is unknown."""
    return None if not every else max(every * 5, 100)


@register
class EvalLessOften(Remedy):
    id = RemedyId.EVAL_LESS_OFTEN
    title = "evaluate and save less often"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``eval_steps`` / ``save_steps``: today's intervals, when the run's configuration says."""
        eval_steps, save_steps = params.get("eval_steps"), params.get("save_steps")
        eval_to, save_to = less_often(eval_steps), less_often(save_steps)
        parts = []
        if eval_to:
            parts.append(f"evaluate every {eval_to} steps instead of {eval_steps}")
        if save_to:
            parts.append(f"save every {save_to} steps instead of {save_steps}")
        text = (
            "Evaluate and checkpoint less often, and on a smaller evaluation set: "
            + ("; ".join(parts) if parts else "raise eval_steps / save_steps (today's are not known here)")
            + "."
        )
        e = eval_to or "E"  # E / S: the new intervals, to choose, when today's are unknown
        s = save_to or "S"
        snippets = {
            Framework.HF_TRAINER: f"args = TrainingArguments(..., eval_steps={e}, save_steps={s}, per_device_eval_batch_size=16)",
            Framework.TRL: f"config = SFTConfig(..., eval_steps={e}, save_steps={s})",
            # an int interval longer than an epoch needs check_val_every_n_epoch=None (Lightning raises otherwise)
            Framework.LIGHTNING: f"L.Trainer(..., val_check_interval={eval_to or 1000}, check_val_every_n_epoch=None, "
            "limit_val_batches=0.1)",
        }
        return Advice(
            text, snippets.get(framework, f"if step % {e} == 0: evaluate()  # and a sampled eval set")
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.LIGHTNING, Framework.PYTORCH)
