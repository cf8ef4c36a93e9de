"""Checkpoint saves in the window: how many, their time, the steps they stalled, by call; each step's own on
its record. The timing: ``torch.save``, ``save_pretrained``, safetensors and the trainers' own save calls,
wrapped at the window's start.

A save blocks the training loop (the Trainer saves between two optimizer steps, so its time lands in the next
step's wall time). Each wrapper calls the original unchanged and reports the outermost call's duration only:
``save_pretrained`` calling safetensors, or a Trainer's checkpoint calling both, counts as one save. Patched
at the start of the measured window (by then the job has imported its framework) through the probe's
``Hooks``, so the probe's removal restores every original. A Trainer's own checkpoint interval
(``trainer_save_steps``) goes into the environment at the first optimizer step (``probe.py``).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from pitstop.core.profile import RankProfile, SaveStats, StepRecord
from pitstop.probe.collectors.base import Collector, ProbeContext, collector
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


@collector
class SaveCollector(Collector):
    """The counters are ``SaveStats`` (the profile's own dataclass); None until the window starts."""

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.stats: SaveStats | None = None
        self._open: list[tuple[str, float]] = []  # saves in the step not closed yet
        self._counting = False

    def start_window(self) -> None:
        self.stats = SaveStats()
        self._counting = True
        install_save_watch(self.ctx.hooks, self.on_save)

    def on_save(self, label: str, seconds: float) -> None:
        """Held until the step the save ran in closes: a save after the last step (the final save at the end
        of training) stalls no measured step and is not counted."""
        if self._counting:
            self._open.append((label, seconds))

    def step_end(self, record: StepRecord) -> None:
        saves, self._open = self._open, []
        stats = self.stats
        if stats is None or not saves:
            return
        stats.steps_with_saves += 1
        step = SaveStats(steps_with_saves=1)  # the step's own share: a window of steps has its saves
        for label, seconds in saves:
            for counts in (stats, step):
                counts.saves += 1
                counts.save_s += seconds
                counts.calls[label] = counts.calls.get(label, 0) + 1
        record.checkpoints = step

    def stop_window(self) -> None:
        self._counting = False

    def fill(self, draft: RankProfile) -> None:
        draft.checkpoints = self.stats
