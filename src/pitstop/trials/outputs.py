"""During trials the job's own files go to a scratch folder: a trial must not overwrite a checkpoint or a log
the user keeps. The Hugging Face Trainer's ``output_dir`` (see ``models``), Lightning's ``default_root_dir``,
``save_pretrained`` and every ``torch.save`` to a path are sent there, keeping their relative layout; a
``torch.load`` of a path the trial saved reads the trial's copy back."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from pitstop.trials.request import FixReport


def redirected(path: Any, scratch: Path) -> Path:
    """Where a trial writes ``path``: under ``scratch/saved``, relative layout kept."""
    p = Path(os.fspath(path))
    if p.is_absolute():
        try:
            p.relative_to(scratch)
            return p  # already a scratch path
        except ValueError:
            p = Path(*p.parts[1:])
    return scratch / "saved" / p


def _note(report: FixReport, line: str) -> None:
    if len(report.redirected) < 20:
        report.redirected.append(line)
        report.save()


def redirect_torch_save(scratch: Path, report: FixReport) -> None:
    import torch

    save, load = torch.save, torch.load

    @functools.wraps(save)
    def saving(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(f, str | os.PathLike):
            target = redirected(f, scratch)
            target.parent.mkdir(parents=True, exist_ok=True)
            _note(report, f"torch.save {os.fspath(f)} → {target}")
            f = target
        return save(obj, f, *args, **kwargs)

    @functools.wraps(load)
    def loading(f: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(f, str | os.PathLike) and redirected(f, scratch).exists():
            f = redirected(f, scratch)  # what this trial saved, not the user's file of the same name
        return load(f, *args, **kwargs)

    torch.save, torch.load = saving, loading


def redirect_save_pretrained(modeling_utils: Any, scratch: Path, report: FixReport) -> None:
    cls = modeling_utils.PreTrainedModel
    original = cls.save_pretrained

    @functools.wraps(original)
    def save_pretrained(model: Any, save_directory: Any, *args: Any, **kwargs: Any) -> Any:
        target = redirected(save_directory, scratch)
        _note(report, f"save_pretrained {os.fspath(save_directory)} → {target}")
        return original(model, target, *args, **kwargs)

    cls.save_pretrained = save_pretrained


def redirect_lightning(trainer_module: Any, scratch: Path, report: FixReport) -> None:
    cls = trainer_module.Trainer
    original = cls.__init__

    @functools.wraps(original)
    def __init__(trainer: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["default_root_dir"] = str(scratch / "lightning")
        _note(report, f"Lightning default_root_dir → {scratch / 'lightning'}")
        original(trainer, *args, **kwargs)

    cls.__init__ = __init__


def redirect_output_dir(args: Any, scratch: Path, report: FixReport) -> None:
    """A TrainingArguments being built during a trial writes its checkpoints into the scratch folder."""
    report.redirected.append(f"TrainingArguments.output_dir {args.output_dir} → {scratch}")
    args.output_dir = str(scratch / "trainer_output")
    report.save()
