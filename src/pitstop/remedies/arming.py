"""Arming the requested remedies in a trial process: each hook waits for the module it changes.

Every remedy's trial patch is one of four hooks (``base.Remedy``); this module installs each kind once —
one ``DataLoader.__init__`` wrapper that runs the loader remedies in their order, one global forward pre-hook
for the first Hugging Face model, one ``TrainingArguments.__post_init__`` wrapper — and the per-module
imports. A hook that fails is reported as skipped; the job goes on.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from pitstop.core.vocabulary import RemedyId
from pitstop.remedies import REGISTRY, Remedy
from pitstop.trials.request import FixReport, FixRequest

AfterImport = Callable[[str, Callable[[ModuleType], None]], None]


def _guarded(name: str, report: FixReport, fn: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    def run(module: ModuleType) -> None:
        try:
            fn(module)
        except Exception as exc:
            report.skip(name, f"could not be installed: {type(exc).__name__}: {exc}")
            print(f"pitstop: fix {name} not installed ({type(exc).__name__}: {exc})", file=sys.stderr)

    return run


def requested(request: FixRequest) -> list[Remedy]:
    """The requested remedies that exist, in registry order."""
    return [r for rid, r in REGISTRY.items() if rid in request.fixes]


def arm_fixes(request: FixRequest, after_import: AfterImport) -> FixReport:
    from pitstop.trials import losses, outputs

    path = request.report_dir / f"fixes-{os.getpid()}.json" if request.report_dir is not None else None
    report = FixReport(path)
    report.save()
    remedies = requested(request)

    def on_torch(torch: ModuleType) -> None:
        patch_dataloader(request, report)
        on_first_model_forward(request, report)
        losses.record_losses(request.loss_steps, report)
        if request.scratch is not None:
            outputs.redirect_torch_save(request.scratch, report)

    def on_training_args(module: ModuleType) -> None:
        patch_training_arguments(module, request, report)

    after_import("torch", _guarded("torch", report, on_torch))
    after_import("transformers.training_args", _guarded("trainer", report, on_training_args))
    for r in remedies:
        for name, hook in r.on_import().items():
            after_import(name, _guarded(r.id, report, functools.partial(_call, hook, request, report)))
    if request.scratch is not None:
        scratch = request.scratch
        after_import(
            "transformers.modeling_utils",
            _guarded("outputs", report, lambda m: outputs.redirect_save_pretrained(m, scratch, report)),
        )
        for name in ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer"):
            after_import(
                name, _guarded("outputs", report, lambda m: outputs.redirect_lightning(m, scratch, report))
            )
    return report


def _call(hook: Any, request: FixRequest, report: FixReport, module: ModuleType) -> None:
    hook(module, request, report)


def patch_dataloader(request: FixRequest, report: FixReport) -> None:
    """Wrap ``DataLoader.__init__`` once: the loader remedies rewrite its arguments, in their order; one that
    raises leaves the arguments as they were."""
    import torch.utils.data as tud

    steps = sorted(
        (r for r in requested(request) if r.loader_order is not None), key=lambda r: r.loader_order or 0
    )
    if not steps:
        return
    original = tud.DataLoader.__init__
    signature = inspect.signature(original)

    def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(loader, *args, **kwargs)
            bound.apply_defaults()
            params = dict(bound.arguments)
            params.pop(next(iter(signature.parameters)))  # the loader itself
        except TypeError:
            original(loader, *args, **kwargs)
            return
        for r in steps:
            before = dict(params)
            try:
                r.rewrite_loader(params, request, report)
            except Exception as exc:  # a fix that cannot handle this loader leaves it as it was
                params.clear()
                params.update(before)
                report.skip(r.id, f"could not be applied: {type(exc).__name__}: {exc}")
        original(loader, **params)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    tud.DataLoader.__init__ = __init__  # type: ignore[method-assign,assignment]


def _is_hf_model(module: Any) -> bool:
    return hasattr(module, "set_attn_implementation") and hasattr(module, "config")


def on_first_model_forward(request: FixRequest, report: FixReport) -> None:
    """One global forward pre-hook, done at the first Hugging Face model it sees and removed at the next
    optimizer step (not inside the forward: torch is iterating over the hooks then)."""
    import torch
    from torch.optim import optimizer as optim_mod

    wanted = [r for r in requested(request) if type(r).on_first_forward is not Remedy.on_first_forward]
    if not wanted:
        return
    done = False

    def hook(module: Any, args: Any) -> None:
        nonlocal done
        if done or not _is_hf_model(module):
            return
        done = True
        for r in wanted:
            try:
                r.on_first_forward(module, request, report)
            except Exception as exc:
                report.skip(r.id, f"could not be applied: {type(exc).__name__}: {exc}")

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)

    def remove(optimizer: Any, args: Any, kwargs: Any) -> None:
        if done:
            handle.remove()

    optim_mod.register_optimizer_step_pre_hook(remove)


def patch_training_arguments(training_args: ModuleType, request: FixRequest, report: FixReport) -> None:
    """``transformers.training_args`` was just imported: rewrite the fields before they are validated."""
    from pitstop.trials.outputs import redirect_output_dir

    cls = training_args.TrainingArguments
    original = cls.__post_init__
    wanted = [
        r for r in requested(request) if type(r).rewrite_training_args is not Remedy.rewrite_training_args
    ]

    @functools.wraps(original)
    def __post_init__(args: Any) -> None:
        if request.scratch is not None:
            redirect_output_dir(args, request.scratch, report)
        for r in wanted:
            r.rewrite_training_args(args, request, report)
        original(args)

    cls.__post_init__ = __post_init__


__all__ = ["RemedyId", "arm_fixes", "patch_dataloader", "patch_training_arguments"]
