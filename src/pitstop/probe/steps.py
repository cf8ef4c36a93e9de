"""The step timeline: where each training step ends, which batch it trained on, its data wait and its
forward / backward / optimizer split.

A step ends at the optimizer's ``step()``. A job that never calls it once per step (the optimizer stepped
inside backward from per-parameter gradient hooks, or a hand-written update under ``torch.no_grad``) has its
steps closed instead at the next forward of the outermost training module once that module's parameters
have changed (their version counters, read on the host: no sync). Rows and tokens come from the DataLoader's
batches, or, where those carry none (a loop that builds its own batches), from that forward's inputs.

The probe hands the hooks' step events here and is told of each closed step (``close``); every other signal
is a collector (``probe.collectors``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from pitstop.core.profile import CountSource, StepBoundary
from pitstop.probe.batch import count_batch, count_model_inputs
from pitstop.probe.environment import wrapped_inside
from pitstop.probe.timeline import (
    BWD_END,
    BWD_START,
    DATA,
    FWD_BOUNDARY,
    FWD_START,
    GEN_END,
    GEN_START,
    OPT_END,
    OPT_START,
    BatchCounts,
    HostClock,
    StepBuilder,
)


class StepTimeline:
    """Turns the hooks' step events (batches, forward, backward, optimizer) into the builder's marks, and
    closes a step where the job's steps end."""

    def __init__(self, close: Callable[[str, Any], None]) -> None:
        self.builder = StepBuilder(HostClock())
        self.forward = ForwardWatch()
        self.close = close  # a step ended: (its end's kind, the optimizer that ended it)
        self.pad_token_id: int | None = None  # the model's padding id, once known (not counted as real)
        self._primary: int | None = None  # id of the optimizer whose steps are the job's
        self._train_thread: int | None = None
        self._bwd_depth = 0
        self._pending: list[tuple[int, BatchCounts]] = []  # (loader key, counts) not yet trained on
        self._train_loader_key: int | None = None
        self._loaders: dict[int, Any] = {}  # loader key -> weak reference to the DataLoader
        self._iter_loader: dict[int, int] = {}  # iterator id -> its loader's key
        self._grad_enabled: Callable[[], bool] | None = None
        self._known: list[int] = []  # loader keys made known by pitstop attach (know_loader)

    def on_train_thread(self) -> bool:
        ident = threading.get_ident()
        if self._train_thread is None:
            self._train_thread = ident
        return ident == self._train_thread

    def on_iterator(self, iterator: Any, loader: Any) -> None:
        """Batches are keyed by their DataLoader, not the iterator: a loop that calls ``iter(loader)`` each
        epoch trains on one loader through many iterators."""
        self._loaders[id(loader)] = weakref.ref(loader)
        self._iter_loader[id(iterator)] = id(loader)

    def on_batch(self, iterator: Any, batch: Any, wait_s: float) -> None:
        if not self.on_train_thread() or self._evaluating():
            return
        self.builder.data_wait(wait_s)
        self.builder.mark(DATA)
        key = self._iter_loader.get(id(iterator))
        if key is None:
            key = self._adopt(iterator)
        self._pending.append((key, count_batch(batch, self.pad_token_id)))

    def know_loader(self, loader: Any) -> None:
        """A DataLoader the job holds, made known by ``pitstop attach`` (which arms the probe mid-epoch): an
        iterator made before the probe was installed is matched to it by its dataset."""
        self._loaders[id(loader)] = weakref.ref(loader)
        self._known.append(id(loader))

    def _adopt(self, iterator: Any) -> int:
        """The key of an iterator whose creation the probe did not see: a known loader over the same dataset,
        else the iterator itself."""
        dataset = getattr(iterator, "_dataset", None)
        key = id(iterator)
        for loader_key, ref in self._loaders.items():
            loader = ref()
            if dataset is not None and loader is not None and getattr(loader, "dataset", None) is dataset:
                key = loader_key
                break
        self._iter_loader[id(iterator)] = key
        return key

    def _evaluating(self) -> bool:
        """A batch taken for evaluation: under ``torch.no_grad`` / ``inference_mode``, or while the training
        model is in another mode than the one it trains in (``model.eval()``)."""
        if self._grad_enabled is None:
            import torch

            self._grad_enabled = torch.is_grad_enabled
        return not self._grad_enabled() or self.forward.evaluating()

    def on_backward(self, starting: bool) -> None:
        if not self.on_train_thread():
            return  # reentrant checkpointing runs nested backward calls on autograd's threads
        if starting:
            self._bwd_depth += 1
            if self._bwd_depth == 1:
                self._commit_batch()
                self.builder.mark(BWD_START)
        else:
            self._bwd_depth = max(0, self._bwd_depth - 1)
            if self._bwd_depth == 0:
                self.builder.mark(BWD_END)

    def _commit_batch(self) -> None:
        """The oldest batch of the training loader not yet trained on is the one this backward belongs to
        (FIFO, so loaders that prefetch ahead and loops that take all of a step's micro-batches before the
        first forward still line up). The training loader is the one trained on before; while it has no batch
        waiting (the first step, a new loader), the loader the job fetched from last. Batches of other loaders
        (evaluation that slipped past ``_evaluating``) are dropped."""
        if not self._pending:
            return
        key = self._train_loader_key
        if all(k != key for k, _ in self._pending):
            key = self._train_loader_key = self._pending[-1][0]
        first = next(i for i, (k, _) in enumerate(self._pending) if k == key)
        counts = self._pending[first][1]
        self._pending = [(k, c) for k, c in self._pending[first + 1 :] if k == key]
        self.builder.batch(counts)

    def on_optimizer(self, optimizer: Any, starting: bool) -> None:
        watch = self.forward
        if self._bwd_depth > 0:  # stepped from a gradient hook (on autograd's thread, on a GPU)
            watch.in_backward = True
            watch.optimizer = watch.optimizer or optimizer
            return
        if not self.on_train_thread():
            return
        watch.inside_step = starting
        if watch.boundary is StepBoundary.MODEL_FORWARD:
            return
        if self._primary is None:
            self._primary = id(optimizer)
        if id(optimizer) != self._primary:
            return
        if starting:
            self.builder.mark(OPT_START)
            return
        watch.boundary = StepBoundary.OPTIMIZER_STEP
        self.close(OPT_END, optimizer)

    def on_forward(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The outermost training forward: a step boundary where the optimizer gives none, and the counts
        of a batch the DataLoader did not hand over."""
        if self._bwd_depth or not self.on_train_thread():
            return
        watch = self.forward
        if module is not watch.root:
            watch.adopt(module)
        watch.note_mode()
        if watch.boundary is not StepBoundary.OPTIMIZER_STEP and watch.params_changed():
            if watch.boundary is None:
                watch.decide()
            self.close(FWD_BOUNDARY, watch.optimizer)
        if self._count_source is not CountSource.DATALOADER:
            # the loop built its batch itself: forward starts here, not where the previous step ended
            self.builder.mark(FWD_START)
            self.builder.model_batch(count_model_inputs(args, kwargs, watch.names, self.pad_token_id))

    def on_generate(self, starting: bool) -> bool:
        """A rollout generation call began (``starting``) or ended: marks the step's GENERATE phase. Only a
        training-thread call while the model trains counts (not evaluation's generation); returns whether this
        one was marked, so its end is marked only if its start was."""
        if not self.on_train_thread() or (starting and self.forward.evaluating()):
            return False
        self.watch_generation()
        self.builder.mark(GEN_START if starting else GEN_END)
        return True

    def watch_generation(self) -> None:
        """Steps from now on carry their generation time (0.0 in a step without a call): a generating trainer
        was recognised, or a call was seen."""
        self.builder.generation_watched = True

    @property
    def _count_source(self) -> CountSource | None:
        """Once a step's DataLoader batches carried tokens, the model's inputs are not counted any more."""
        sources = self.builder.count_sources
        return sources.get(self.builder.index) if sources else None

    def train_loader(self) -> Any:
        """The DataLoader the job trains on, while it lives (armed mid-step by pitstop attach, before a batch
        was trained on: the one loader found on the job's stacks)."""
        key = self._train_loader_key
        if key is None and len(self._known) == 1:
            key = self._known[0]
        ref = self._loaders.get(key) if key is not None else None
        return ref() if ref is not None else None


class ForwardWatch:
    """The outermost training module, its forward's parameter names, and the version counters of two of its
    trainable parameters (first and last): a change between two forwards without an optimizer step closing a
    step in between is an update the optimizer hooks did not see."""

    def __init__(self) -> None:
        self.root: Any = None
        self.names: tuple[str, ...] = ()
        self.boundary: StepBoundary | None = None
        self.reason: str | None = None
        self.in_backward = False  # an optimizer stepped inside backward (per-parameter gradient hooks)
        self.inside_step = False  # between an optimizer's step pre- and post-hook (a closure's forwards)
        self.optimizer: Any = None  # one optimizer stepped inside backward, to read its facts
        self._watched: list[Any] = []
        self._versions: tuple[int, ...] | None = None
        self._inner: Any = None  # the module inside DDP / FSDP / compile wrappers
        self._train_mode: bool | None = None  # the mode (``training``) its training forwards ran in

    def adopt(self, module: Any) -> None:
        import inspect

        self.root = module
        trainable = [p for p in module.parameters() if p.requires_grad]
        self._watched = [trainable[0], trainable[-1]] if trainable else []
        self._versions = None
        inner = module
        for _ in range(4):  # DDP / FSDP / compile wrappers forward *args to the module inside
            inside = wrapped_inside(inner)
            inner = inside if inside is not None else inner
        self._inner = inner
        self._train_mode = None
        try:
            params = inspect.signature(inner.forward).parameters.values()
            self.names = tuple(
                p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            )
        except (TypeError, ValueError):
            self.names = ()

    def _mode(self) -> bool:
        return bool(getattr(self.root, "training", True) and getattr(self._inner, "training", True))

    def note_mode(self) -> None:
        """At a training forward: the mode the model trains in (some jobs train in ``eval()`` mode)."""
        self._train_mode = self._mode()

    def evaluating(self) -> bool:
        """Whether the model is now in another mode than the one it trains in (``model.eval()``)."""
        return self._train_mode is not None and self._mode() != self._train_mode

    def params_changed(self) -> bool:
        """Whether the watched parameters changed since the previous forward (not inside an optimizer step:
        a closure's forwards belong to its step)."""
        if self.inside_step:
            return False
        versions = tuple(p._version for p in self._watched)
        before, self._versions = self._versions, versions
        return before is not None and versions != before

    def decide(self) -> None:
        self.boundary = StepBoundary.MODEL_FORWARD
        self.reason = (
            "the optimizer steps inside backward (per-parameter gradient hooks)"
            if self.in_backward
            else "the parameters change without an optimizer step (a hand-written update)"
        )
