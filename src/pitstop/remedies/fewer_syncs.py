"""Keep the host ahead of the GPU: no per-step reads of device values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, code, register


@register
class FewerSyncs(Remedy):
    id = RemedyId.FEWER_SYNCS
    title = "fewer host-device synchronizations"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        text = (
            "Keep the host ahead of the GPU: do not call .item(), .cpu(), print a tensor or synchronize on every "
            "step. Accumulate metrics on the device and read them every N steps."
        )
        if framework.is_trainer:
            return Advice(
                text,
                f"args = {framework.args_class}(..., logging_steps=50)   # each log reads the loss from the GPU",
            )
        if framework is Framework.LIGHTNING:
            return Advice(
                text, "self.log('loss', loss, on_step=True, sync_dist=False)  # log tensors, not .item()"
            )
        return Advice(
            text,
            code("""
                running = torch.zeros((), device="cuda")
                for step, batch in enumerate(loader):
                    loss = model(**batch).loss
                    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
                    running += loss.detach()                 # stays on the GPU: no sync
                    if step % 50 == 0:
                        print(running.item() / 50); running.zero_()   # one sync every 50 steps
            """),
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.LIGHTNING, Framework.PYTORCH)
