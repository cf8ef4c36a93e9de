"""Running a model's every forward under autocast, from outside the job, from the very first call.

A global forward pre-hook sees the model's first call after ``Module.__call__`` has already chosen the
forward to run, so replacing ``forward`` there would leave that first call in fp32. Instead the context is
entered in the pre-hook and left in a forward hook that always runs, on every call.
"""

from __future__ import annotations

from typing import Any


def autocast_every_forward(model: Any, dtype_name: str) -> str:
    """Enter autocast now (the call about to run) and around every later forward of ``model``.
    Returns the device type autocast runs on."""
    import torch

    device = next((p.device.type for p in model.parameters()), "cpu")
    dtype = getattr(torch, dtype_name)
    open_contexts: list[Any] = []

    def enter(module: Any, args: Any) -> None:
        ctx = torch.autocast(device_type=device, dtype=dtype)
        ctx.__enter__()
        open_contexts.append(ctx)

    def leave(module: Any, args: Any, output: Any) -> None:
        if open_contexts:
            open_contexts.pop().__exit__(None, None, None)

    enter(model, ())  # the call the global hook is inside of
    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)
    return device
