"""The words pitstop's documents use, as enums. Each member *is* its string (StrEnum), so JSON and old
documents read the same; code compares against members, never against loose string literals."""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, Enum):
        def __str__(self) -> str:
            return str(self.value)


class Framework(StrEnum):
    """What drives the training loop; a fix is written for it."""

    PYTORCH = "pytorch"
    HF_TRAINER = "hf_trainer"
    TRL = "trl"
    ACCELERATE = "accelerate"
    LIGHTNING = "lightning"
    DEEPSPEED = "deepspeed"

    @property
    def is_trainer(self) -> bool:
        """HF Trainer and TRL's trainers take the same TrainingArguments-style settings."""
        return self in (Framework.HF_TRAINER, Framework.TRL)

    @property
    def args_class(self) -> str:
        """The arguments class a Trainer-style job sets (SFTConfig for TRL)."""
        return "SFTConfig" if self is Framework.TRL else "TrainingArguments"

    @classmethod
    def of(cls, value: str | None) -> Framework:
        """The framework named by ``value``; plain PyTorch when unknown."""
        try:
            return cls(value) if value else cls.PYTORCH
        except ValueError:
            return cls.PYTORCH


class Severity(StrEnum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"

    @property
    def order(self) -> int:
        """0 for the most severe."""
        return _SEVERITY_ORDER[self]


_SEVERITY_ORDER = {Severity.HIGH: 0, Severity.MEDIUM: 1, Severity.LOW: 2}


class Device(StrEnum):
    CPU = "cpu"
    CUDA = "cuda"
    ROCM = "rocm"
    MPS = "mps"


class Source(StrEnum):
    """Where a RunProfile came from."""

    DOCTOR = "doctor"
    CALLBACK = "callback"
    WATCH = "watch"
    ANALYZE = "analyze"
    TUNE = "tune"
    CHECK = "check"
