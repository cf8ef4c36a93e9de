"""What a remedy is: one change a user can make, defined once.

A cause says what is wrong; a remedy says what to change (the cause, in ``diagnose/causes``, names the
remedies that answer it). Each remedy declares whether it preserves what the model computes (tune then compares losses), what it cannot be combined with,
its advice for every framework — one builder serves a Finding's fix *and* the change tune prints when it keeps
the remedy, so the two cannot disagree — and, when tune can try it without editing the job, its in-job patch.

Remedies are pure until a trial calls one of their hooks: importing this package imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from textwrap import dedent
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

from pitstop.core.vocabulary import Framework, RemedyId

if TYPE_CHECKING:
    from pitstop.trials.request import FixReport, FixRequest


def code(text: str) -> str:
    """A snippet written indented in the source, without its indentation and surrounding blank lines."""
    return dedent(text).strip("\n")


@dataclass(frozen=True)
class Advice:
    """What to change, in one sentence, and the code that changes it in one framework."""

    text: str
    snippet: str


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
    effect: ClassVar[str] = ""  # what it keeps or changes of the computation, one phrase
    preserves_computation: ClassVar[bool] = True  # same examples, same per-token losses up to fp order
    exclusive_with: ClassVar[tuple[RemedyId, ...]] = ()
    helps_with: ClassVar[tuple[RemedyId, ...]] = ()  # its gain may show only on top of these
    # it changes the rows or lengths of the job's batches: steps/s (tune's rate when the job's tokens and rows
    # are unknown) does not compare across it
    changes_batch_shape: ClassVar[bool] = False
    tunable: ClassVar[bool] = False  # tune can apply it from outside the job
    # when tunable: its place in tune's order among the remedies of one cause (lower first: most promising)
    tune_rank: ClassVar[int | None] = None
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
    """Class decorator: one instance per remedy (``pitstop.remedies`` puts the registry in tune's order)."""
    if cls.id in REGISTRY:
        raise ValueError(f"remedy {cls.id} registered twice")
    REGISTRY[cls.id] = cls()
    return cls
