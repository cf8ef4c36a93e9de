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
    ATTACH = "attach"


class Sharding(StrEnum):
    """How FSDP shards a model (PyTorch's ``ShardingStrategy`` names, lower case). DeepSpeed's ZeRO stages map
    onto them: 0 ≈ NO_SHARD (DDP), 1/2 ≈ SHARD_GRAD_OP, 3 ≈ FULL_SHARD, 3 with ZeRO++ hpZ ≈ HYBRID_SHARD."""

    NO_SHARD = "no_shard"
    SHARD_GRAD_OP = "shard_grad_op"
    FULL_SHARD = "full_shard"
    HYBRID_SHARD = "hybrid_shard"
    HYBRID_SHARD_ZERO2 = "hybrid_shard_zero2"

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage whose memory this strategy has (within its shard group)."""
        return {"no_shard": 0, "shard_grad_op": 2, "hybrid_shard_zero2": 2}.get(self.value, 3)

    @property
    def hybrid(self) -> bool:
        """Shards inside a node and replicates across nodes."""
        return self in (Sharding.HYBRID_SHARD, Sharding.HYBRID_SHARD_ZERO2)

    @classmethod
    def parse(cls, value: object) -> Sharding | None:
        """A strategy from a config's words: ``FULL_SHARD``, ``full_shard auto_wrap``, ``ShardingStrategy.
        FULL_SHARD`` or Accelerate's numbers 1-5; None when nothing names one."""
        numbers = {
            1: "full_shard",
            2: "shard_grad_op",
            3: "no_shard",
            4: "hybrid_shard",
            5: "hybrid_shard_zero2",
        }
        if isinstance(value, bool):
            return None
        if isinstance(value, int):
            value = numbers.get(value)
        if isinstance(value, list | tuple):
            value = " ".join(str(v) for v in value)
        if not isinstance(value, str):
            return None
        text = value.strip()
        if text.isdecimal():  # not isdigit: '²' is a digit int() refuses
            return cls.parse(int(text))
        words = text.lower().replace("shardingstrategy.", "").replace(",", " ").split()
        for word in words:
            if word in cls._value2member_map_:
                return cls(word)
        return None
