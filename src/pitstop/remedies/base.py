"""What a remedy is: one change a user can make, defined once.

A cause says what is wrong; a remedy says what to change. Each remedy declares the causes it addresses,
whether it preserves what the model computes (tune then compares losses), what it cannot be combined with,
its advice for every framework — one builder serves a Finding's fix *and* the change tune prints when it keeps
the remedy, so the two cannot disagree — and, when tune can try it without editing the job, its in-job patch.

Remedies are pure until a trial calls one of their hooks: importing this package imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from textwrap import dedent
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

from pitstop.vocabulary import Framework, StrEnum

if TYPE_CHECKING:
    from pitstop.trials.request import FixReport, FixRequest


class RemedyId(StrEnum):
    """Stable ids: tune's ``--try`` / ``--skip`` names and the ``fix`` of tune's JSON."""

    ATTENTION = "attention"
    PRETOKENIZE = "pretokenize"
    WORKERS = "workers"
    TRIM_PADDING = "trim_padding"
    PACK_BATCH = "pack_batch"
    PACK = "pack"
    GROUP_BY_LENGTH = "group_by_length"
    MICRO_BATCH = "micro_batch"
    TF32 = "tf32"
    BF16 = "bf16"
    FP16 = "fp16"
    NO_CHECKPOINTING = "no_checkpointing"
    PIN_MEMORY = "pin_memory"
    NO_OFFLOAD = "no_offload"
    FEWER_SYNCS = "fewer_syncs"
    BALANCE_RANKS = "balance_ranks"
    FUSED_KERNELS = "fused_kernels"
    OVERLAP_COMM = "overlap_comm"
    EVAL_LESS_OFTEN = "eval_less_often"
    USE_EVERY_GPU = "use_every_gpu"
    SAVE_LESS_OFTEN = "save_less_often"
    CPU_THREADS = "cpu_threads"
    FUSED_OPTIMIZER = "fused_optimizer"
    COMPILE_MODEL = "compile_model"
    LIGER_KERNELS = "liger_kernels"
    EXPANDABLE_SEGMENTS = "expandable_segments"
    UNTHROTTLE_GPU = "unthrottle_gpu"
    BIGGER_BUCKETS = "bigger_buckets"
    NO_SYNC_ACCUMULATION = "no_sync_accumulation"
    FIX_TRANSPORT = "fix_transport"
    NCCL_BACKEND = "nccl_backend"
    LIGHTER_SHARDING = "lighter_sharding"


def code(text: str) -> str:
    """A snippet written indented in the source, without its indentation and surrounding blank lines."""
    return dedent(text).strip("\n")


@dataclass(frozen=True)
class Advice:
    """What to change, in one sentence, and the code that changes it in one framework."""

    text: str
    snippet: str


@dataclass(frozen=True)
class Use:
    """A rule's (or tune's) reference to a remedy with the parameters the evidence gave it."""

    remedy: RemedyId
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def to_dict(self) -> dict[str, Any]:
        return {"id": str(self.remedy), "params": dict(self.params)}


def use(remedy: RemedyId, **params: Any) -> Use:
    return Use(remedy, MappingProxyType(params))


@dataclass(frozen=True)
class TrialFacts:
    """What tune knows about the job when it decides whether a remedy can be tried on it."""

    on_gpu: bool
    hf_model: bool
    framework: Framework
    examples_are_text: bool | None
    gpu_has_bf16: bool | None = None  # None when unknown (no GPU in the hardware table)
    gpu_has_tf32: bool | None = None


LoaderParams = dict[str, Any]  # DataLoader.__init__'s arguments, by name


class Remedy:
    """Subclass, set the class attributes, write ``advice``; add trial hooks when tune can try it."""

    id: ClassVar[RemedyId]
    title: ClassVar[str]  # one phrase for tune's table
    causes: ClassVar[tuple[str, ...]] = ()  # the causes it addresses, in the catalogue's ids
    effect: ClassVar[str] = ""  # what it keeps or changes of the computation, one phrase
    preserves_computation: ClassVar[bool] = True  # same examples, same per-token losses up to fp order
    exclusive_with: ClassVar[tuple[RemedyId, ...]] = ()
    helps_with: ClassVar[tuple[RemedyId, ...]] = ()  # its gain may show only on top of these
    # it changes the rows or lengths of the job's batches: steps/s (tune's rate when the job's tokens and rows
    # are unknown) does not compare across it
    changes_batch_shape: ClassVar[bool] = False
    tunable: ClassVar[bool] = False  # tune can apply it from outside the job
    # when tunable and it rewrites DataLoader arguments: its place among the loader remedies (lower first)
    loader_order: ClassVar[int | None] = None

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        raise NotImplementedError

    def frameworks(self) -> tuple[Framework, ...]:
        """The frameworks whose advice differs from plain PyTorch's (a Finding carries a snippet for each)."""
        return tuple(Framework)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        """Why tune cannot try it on this job (None: it can)."""
        return None if self.tunable else "not something tune can switch on from outside the job"

    # trial hooks: called inside the job that tune starts; each may report.apply / report.skip
    def on_import(self) -> Mapping[str, Callable[[ModuleType, FixRequest, FixReport], None]]:
        """Module name -> what to do once that module is imported."""
        return {}

    def rewrite_loader(self, params: LoaderParams, request: FixRequest, report: FixReport) -> None:
        """Change a DataLoader's constructor arguments (only for remedies with a ``loader_order``)."""

    def on_first_forward(self, model: Any, request: FixRequest, report: FixReport) -> None:
        """The first forward of a Hugging Face model is about to run."""

    def rewrite_training_args(self, args: Any, request: FixRequest, report: FixReport) -> None:
        """A TrainingArguments (or SFTConfig) is being built, before it validates its fields."""


REGISTRY: dict[RemedyId, Remedy] = {}


def at_first_optimizer_step(action: Callable[[], None]) -> Any:
    """Run ``action`` once, just before the job's first optimizer step: where a trial checks that its fix is
    still in effect before its window counts (a verdict on a fix the job undid would measure nothing).
    Returns the hook's handle (a trial process never removes it; a test does)."""
    from torch.optim import optimizer as optim_mod

    done = False

    def once(optimizer: Any, args: Any, kwargs: Any) -> None:
        nonlocal done
        if not done:
            done = True
            action()

    return optim_mod.register_optimizer_step_pre_hook(once)


def register(cls: type[Remedy]) -> type[Remedy]:
    """Class decorator: one instance per remedy, in registration order (tune's order within a cause)."""
    if cls.id in REGISTRY:
        raise ValueError(f"remedy {cls.id} registered twice")
    REGISTRY[cls.id] = cls()
    return cls
