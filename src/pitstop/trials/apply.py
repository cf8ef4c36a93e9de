"""Arming the requested fixes in a trial process: each waits for the module it changes to be imported."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import ModuleType

from pitstop.trials.request import FixReport, FixRequest

AfterImport = Callable[[str, Callable[[ModuleType], None]], None]


def _guarded(fix: str, report: FixReport, fn: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    """A fix that fails to install is reported as skipped; the job goes on."""

    def run(module: ModuleType) -> None:
        try:
            fn(module)
        except Exception as exc:
            report.skip(fix, f"could not be installed: {type(exc).__name__}: {exc}")
            print(f"pitstop: fix {fix} not installed ({type(exc).__name__}: {exc})", file=sys.stderr)

    return run


def arm_fixes(request: FixRequest, after_import: AfterImport) -> FixReport:
    from pitstop.trials import losses, outputs

    path = None
    if request.report_dir is not None:
        path = request.report_dir / f"fixes-{os.getpid()}.json"
    report = FixReport(path)
    report.save()

    def on_torch(torch: ModuleType) -> None:
        from pitstop.trials.loaders import patch_dataloader
        from pitstop.trials.models import enable_tf32, on_first_model_forward

        patch_dataloader(request, report)
        on_first_model_forward(request, report)
        enable_tf32(request, report)
        losses.record_losses(request.loss_steps, report)
        if request.scratch is not None:
            outputs.redirect_torch_save(request.scratch, report)

    def on_training_args(module: ModuleType) -> None:
        from pitstop.trials.models import patch_training_arguments

        patch_training_arguments(module, request, report)

    def on_modeling_utils(module: ModuleType) -> None:
        from pitstop.trials.models import patch_checkpointing

        patch_checkpointing(module, request, report)
        if request.scratch is not None:
            outputs.redirect_save_pretrained(module, request.scratch, report)

    after_import("torch", _guarded("torch", report, on_torch))
    after_import("transformers.training_args", _guarded("trainer", report, on_training_args))
    if "no_checkpointing" in request.fixes or request.scratch is not None:
        after_import("transformers.modeling_utils", _guarded("no_checkpointing", report, on_modeling_utils))
    if request.scratch is not None:
        scratch = request.scratch
        for name in ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer"):
            after_import(
                name, _guarded("outputs", report, lambda m: outputs.redirect_lightning(m, scratch, report))
            )
    return report
