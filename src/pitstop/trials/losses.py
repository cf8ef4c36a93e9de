"""The losses of the first optimizer steps, so `tune` can check that a fix meant to preserve the computation
did: per optimizer step, the sum of the scalars handed to backward (for the Hugging Face Trainer, whose
micro-batch losses are divided by the step's token count, that sum is the step's loss whatever the split
into micro-batches). Reading a loss syncs the device, so only the first steps are read, inside the warm-up.
"""

from __future__ import annotations

import os
from typing import Any

from pitstop.trials.request import FixReport


def record_losses(steps: int, report: FixReport) -> None:
    import torch
    from torch.optim import optimizer as optim_mod

    if steps <= 0:
        return
    pid = os.getpid()
    current: list[float] = []
    original = torch.autograd.backward
    done = False

    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if not done and os.getpid() == pid and hasattr(tensors, "numel") and tensors.numel() == 1:
            current.append(float(tensors.detach().float()))
        return original(tensors, *args, **kwargs)

    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        nonlocal done
        if done or os.getpid() != pid or not current:
            return
        report.losses.append(sum(current))
        current.clear()
        if len(report.losses) >= steps:
            done = True  # the hook stays, a no-op: torch is iterating over the hooks right now
            if torch.autograd.backward is backward:
                torch.autograd.backward = original
        report.save()

    torch.autograd.backward = backward
    optim_mod.register_optimizer_step_post_hook(after_step)
