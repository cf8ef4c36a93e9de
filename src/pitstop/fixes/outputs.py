"""During trials the job's own files go to a scratch folder: a trial must not overwrite a checkpoint or a log
the user keeps. The Hugging Face Trainer's ``output_dir`` (see ``models``), Lightning's ``default_root_dir``
and every ``torch.save`` to a path are sent there."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from pitstop.fixes.request import FixReport


def redirect_torch_save(scratch: Path, report: FixReport) -> None:
    import torch

    original = torch.save

    @functools.wraps(original)
    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(f, str | os.PathLike):
            target = scratch / "saved" / Path(os.fspath(f)).name
            target.parent.mkdir(parents=True, exist_ok=True)
            if len(report.redirected) < 20:
                report.redirected.append(f"torch.save {os.fspath(f)} → {target}")
                report.save()
            f = target
        return original(obj, f, *args, **kwargs)

    torch.save = save


def redirect_lightning(trainer_module: Any, scratch: Path, report: FixReport) -> None:
    cls = trainer_module.Trainer
    original = cls.__init__

    @functools.wraps(original)
    def __init__(trainer: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["default_root_dir"] = str(scratch / "lightning")
        report.redirected.append(f"Lightning default_root_dir → {scratch / 'lightning'}")
        report.save()
        original(trainer, *args, **kwargs)

    cls.__init__ = __init__
