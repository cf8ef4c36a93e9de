"""Activation checkpointing seen at work: ``torch.utils.checkpoint.checkpoint`` calls in the window, for a job
whose configuration did not say (a hand-written model), and which of its two variants ran.

The variant is read where torch runs it, not from the call's arguments: the reentrant variant is
``CheckpointFunction`` (its ``forward`` counted), the non-reentrant one the generator
``_checkpoint_without_reentrant_generator`` that ``checkpoint()`` looks up by name at every call. Both are
patched on torch's own module and class, so a call that bound ``checkpoint`` before the probe (Transformers'
``partial(checkpoint, use_reentrant=...)``, FSDP's ``checkpoint_wrapper``) or a trial that changed the variant
is counted as it ran; torch's default for a call that leaves ``use_reentrant`` unset (reentrant, with a
warning, in torch 2.13) needs no copy here.

A reentrant recompute runs the checkpointed function whole inside the backward. Where that function calls an
FSDP unit (its hooks inside the checkpoint: ``checkpoint(fsdp_layer, ...)``, ``checkpoint_wrapper`` applied
before FSDP wrapping, older Transformers checkpointing ``decoder_layer.__call__``), FSDP1 all-gathers
the unit's parameters for the recompute and again for its backward; FSDP2 handles its own unit but runs the
forward prefetches set on it (``set_modules_to_forward_prefetch``) again. Measured on two gloo ranks, four
Llama layers: 13 all-gathers a step against 9 non-reentrant (FSDP1), 12 against 9 (FSDP2 with prefetch); the
same with the checkpoint inside the unit (Transformers 5's layers checkpoint their ``forward``): 9 and 9. Each reentrant call
counts the repeats its function implies (``regathers``)."""

from __future__ import annotations

import functools
import os
import sys
import weakref
from dataclasses import dataclass
from types import FrameType
from typing import Any

from pitstop.core.profile import Checkpointing, RankProfile
from pitstop.probe.collectors.base import ProbeContext, WindowCounts, collector

CALLS_HOOKS = ("__call__", "_wrapped_call_impl", "_call_impl")  # a module's bound methods that run its hooks
PITSTOP_DIR = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
CHECKPOINT_FILE = f"{os.sep}torch{os.sep}utils{os.sep}checkpoint.py"
# torch's private modules: torch/_compile.py (checkpoint's dynamo-disabling wrapper), torch/_dynamo
TORCH_PRIVATE = f"{os.sep}torch{os.sep}_"


@dataclass
class CheckpointCalls:
    calls: int = 0  # torch.utils.checkpoint.checkpoint calls seen through the probe's wrapper
    reentrant: int = 0
    non_reentrant: int = 0
    regathers: int = 0
    site: str | None = None


def called_module(function: Any) -> tuple[Any, bool] | None:
    """The module a checkpointed callable runs, and whether its hooks run (its ``__call__``, not its bare
    ``forward``); None when it runs none: a plain function, or ``partial(forward, module)`` (Transformers
    5's layers, which keep a unit's hooks outside the checkpoint on purpose)."""
    from torch import nn

    for _ in range(8):
        if not isinstance(function, functools.partial):
            break
        function = function.func
    if isinstance(function, nn.Module):
        return function, True
    owner = getattr(function, "__self__", None)
    if isinstance(owner, nn.Module):
        name = getattr(function, "__name__", "")
        return (owner, True) if name in CALLS_HOOKS else (owner, False) if name == "forward" else None
    for cell in getattr(function, "__closure__", None) or ():  # checkpoint_wrapper's kwargs-packing closure
        try:
            held = cell.cell_contents
        except ValueError:
            continue
        if isinstance(held, nn.Module):
            return held, True
    return None


def fsdp_regathers(module: Any, hooks_run: bool) -> int:
    """All-gathers a reentrant recompute of ``module`` repeats: each FSDP1 unit inside that reshards after
    forward (FSDP1's unshard is in its ``forward`` itself), and, where hooks run, each forward prefetch set on
    an FSDP2 unit inside. 0 when the job never imported FSDP."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is None:
        return 0
    fsdp1, fsdp2 = getattr(fsdp, "FullyShardedDataParallel", None), getattr(fsdp, "FSDPModule", None)
    strategy = getattr(fsdp, "ShardingStrategy", None)
    resharding = (strategy.FULL_SHARD, strategy.HYBRID_SHARD) if strategy is not None else ()
    count = 0
    for sub in module.modules():
        if fsdp1 is not None and isinstance(sub, fsdp1):
            count += getattr(sub, "sharding_strategy", None) in resharding
        elif hooks_run and fsdp2 is not None and isinstance(sub, fsdp2):
            state = sub._get_fsdp_state()
            count += len(getattr(state, "_states_to_forward_prefetch", None) or ())
    return count


def _caller_of_checkpoint() -> str | None:
    """The line that called ``torch.utils.checkpoint.checkpoint``: a library's path from its package folder
    ("transformers/modeling_layers.py:123"), the job's in full."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and not frame.f_code.co_filename.endswith(CHECKPOINT_FILE):
        frame = frame.f_back
    while frame is not None and (
        frame.f_code.co_filename.endswith(CHECKPOINT_FILE)
        or TORCH_PRIVATE in frame.f_code.co_filename
        or frame.f_code.co_filename.startswith(PITSTOP_DIR)
    ):
        frame = frame.f_back  # torch's own checkpoint frames, its dynamo wrapper, and the probe's wrapper
    if frame is None:
        return None
    name = frame.f_code.co_filename
    marker = f"{os.sep}site-packages{os.sep}"
    if marker in name:
        name = name.split(marker, 1)[1]
    return f"{name}:{frame.f_lineno}"


@collector
class RecomputeCollector(WindowCounts[CheckpointCalls]):
    counts_type = CheckpointCalls

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        # module -> {hooks run: its regathers}: worked out once per module, not at every call
        self._regathers: weakref.WeakKeyDictionary[Any, dict[bool, int]] = weakref.WeakKeyDictionary()

    def on_checkpoint(self) -> None:
        self.counts.calls += 1

    def install(self) -> None:
        import torch
        import torch.utils.checkpoint as ckpt

        compiling = torch.compiler.is_compiling
        function = getattr(ckpt, "CheckpointFunction", None)
        if function is not None and callable(getattr(function, "forward", None)):

            def make_forward(original: Any) -> Any:
                run = original.__func__ if isinstance(original, staticmethod) else original

                def forward(ctx: Any, run_function: Any, *args: Any) -> Any:
                    if self.ctx.hooks.active and not compiling():
                        self._guarded(self._reentrant, run_function)
                    return run(ctx, run_function, *args)

                return staticmethod(forward)

            self.ctx.hooks.patch(function, "forward", make_forward)
        if callable(getattr(ckpt, "_checkpoint_without_reentrant_generator", None)):

            def make_generator(original: Any) -> Any:
                def generator(*args: Any, **kwargs: Any) -> Any:
                    if self.ctx.hooks.active and not compiling():
                        self.counts.non_reentrant += 1
                    return original(*args, **kwargs)

                return generator

            self.ctx.hooks.patch(ckpt, "_checkpoint_without_reentrant_generator", make_generator)

    def _guarded(self, fn: Any, *args: Any) -> None:
        """An internal error disables the probe, never the job's backward."""
        try:
            fn(*args)
        except Exception as exc:
            self.ctx.disable(exc)

    def _reentrant(self, run_function: Any) -> None:
        counts = self.counts
        counts.reentrant += 1
        if counts.site is None:
            counts.site = _caller_of_checkpoint()
        found = called_module(run_function)
        if found is None:
            return
        module, hooks_run = found
        known = self._regathers.get(module)
        if known is None:
            known = self._regathers.setdefault(module, {})
        if hooks_run not in known:
            known[hooks_run] = fsdp_regathers(module, hooks_run)
        counts.regathers += known[hooks_run]

    def fill(self, draft: RankProfile) -> None:
        env = draft.environment
        c = self.counts
        if env.gradient_checkpointing is None and (c.calls or c.reentrant or c.non_reentrant):
            env.gradient_checkpointing = True
        if c.reentrant or c.non_reentrant:
            env.checkpoint_reentrant = c.reentrant > 0
            draft.checkpointing = Checkpointing(
                reentrant=c.reentrant, non_reentrant=c.non_reentrant, regathers=c.regathers, site=c.site
            )
