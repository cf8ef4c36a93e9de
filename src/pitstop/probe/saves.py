"""Timing checkpoint saves: ``torch.save``, ``save_pretrained``, safetensors and the trainers' own save calls.

A save blocks the training loop (the Trainer saves between two optimizer steps, so its time lands in the next
step's wall time). Each wrapper calls the original unchanged and reports the outermost call's duration only:
``save_pretrained`` calling safetensors, or a Trainer's checkpoint calling both, counts as one save. Patched
at the start of the measured window (by then the job has imported its framework) through the probe's
``Hooks``, so the probe's removal restores every original.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from pitstop.probe.hooks import Hooks

# (module, owner attribute path or "" for a module function, function name, the label reported)
_TARGETS: tuple[tuple[str, str, str, str], ...] = (
    ("torch", "", "save", "torch.save"),
    ("safetensors.torch", "", "save_file", "safetensors.save_file"),
    ("transformers.modeling_utils", "PreTrainedModel", "save_pretrained", "save_pretrained"),
    ("transformers.trainer", "Trainer", "_save_checkpoint", "Trainer checkpoint"),
    ("accelerate.accelerator", "Accelerator", "save_state", "Accelerator.save_state"),
    ("lightning.pytorch.trainer.trainer", "Trainer", "save_checkpoint", "Lightning checkpoint"),
    ("pytorch_lightning.trainer.trainer", "Trainer", "save_checkpoint", "Lightning checkpoint"),
)


def install_save_watch(hooks: Hooks, on_save: Callable[[str, float], None]) -> list[str]:
    """Wrap every save function of an already imported module; returns the labels wrapped."""
    depth = threading.local()
    wrapped: list[str] = []

    def make(label: str) -> Callable[[Any], Any]:
        def wrap(original: Any) -> Any:
            def save(*args: Any, **kwargs: Any) -> Any:
                outer = getattr(depth, "n", 0) == 0
                depth.n = getattr(depth, "n", 0) + 1
                t0 = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    depth.n -= 1
                    if outer and hooks.active:
                        hooks.listener.guard(on_save, label, time.perf_counter() - t0)

            return save

        return wrap

    for module_name, owner_name, fn, label in _TARGETS:
        module = sys.modules.get(module_name)
        owner = getattr(module, owner_name, None) if owner_name else module
        if owner is None or not callable(getattr(owner, fn, None)):
            continue
        hooks.patch(owner, fn, make(label))
        wrapped.append(label)
    return wrapped


def trainer_save_steps(trainer: Any) -> int | None:
    """The Trainer's checkpoint interval in steps (None: it saves by epoch, never, or there is no Trainer)."""
    args = getattr(trainer, "args", None)
    strategy = str(getattr(args, "save_strategy", "")).lower()
    steps = getattr(args, "save_steps", None)
    if not strategy.endswith("steps") or not isinstance(steps, int | float) or steps < 1:
        return None
    return int(steps)
