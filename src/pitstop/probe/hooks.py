"""The places the probe listens at, installed on torch and removed again.

Optimizer steps use torch's own global step hooks. The training model's outermost forward is found with
torch's global module hooks (the first call, outside any other module's, with grad enabled, of a module that
has trainable parameters); those are removed at once and a forward pre-hook on that module alone reports
each of its calls with its inputs, so the modules inside it keep torch's hook-free fast path. The rest are thin wrappers that call the original
first-class function unchanged and report to a listener afterwards: the DataLoader iterator's
``__next__`` (time blocked, what the batch carried), ``torch.autograd.backward``, SDPA and autocast
entry (which attention path and dtype ran), and, on a GPU, the calls that block the host on the device.
A wrapper never alters arguments or results; under ``torch.compile`` tracing and during CUDA-graph
capture it steps aside (recording a timing event or reading the clock there would break the capture or
be traced into the graph).

Host syncs on a GPU are found two ways. The Python-visible ones (``item``, ``tolist``, ``cpu``,
``bool(t)``, ``float(t)``, ``int(t)``, ``nonzero``, blocking ``.to()`` / ``.cuda()`` copies and the
explicit device / stream / event ``synchronize``) are wrapped and timed. Everything else that syncs inside
a C++ op (boolean-mask indexing, ``masked_select``, ``unique``, ``copy_`` ...) is caught by torch's own
detector, ``torch.cuda.set_sync_debug_mode("warn")``, whose warning is raised as the op returns and is
swallowed here: counted and attributed to its call site, but not timed (the op's start is not seen).
``torch.cuda._gpu_trace``'s synchronization callbacks were not used: activating the GPU trace cannot be
undone and sends every allocation and event through Python for the rest of the process.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, Protocol

SYNC_WARNING = "called a synchronizing CUDA operation"  # c10::cuda::warn_or_error_on_sync's text
_TENSOR_SYNCS = {
    "item": "item",
    "tolist": "tolist",
    "cpu": "cpu",
    "__bool__": "bool",
    "__float__": "float",
    "__int__": "int",
    "__index__": "int",
    "nonzero": "nonzero",
}
_COMPILE_HOOK_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"
_PITSTOP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Listener(Protocol):
    def on_iterator(self, iterator: Any, loader: Any) -> None: ...
    def on_batch(self, iterator: Any, batch: Any, wait_s: float) -> None: ...
    def on_collate(self, samples: Any, seconds: float) -> None: ...
    def on_backward(self, starting: bool) -> None: ...
    def on_optimizer(self, optimizer: Any, starting: bool) -> None: ...
    def on_forward(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None: ...
    def on_sdpa(self, has_mask: bool) -> None: ...
    def on_autocast(self, device_type: str, dtype: Any, enabled: bool) -> None: ...
    def on_checkpoint(self) -> None: ...
    def on_sync(self, seconds: float | None, kind: str, site: str) -> None: ...
    def on_copy(self, pinned: bool, non_blocking: bool) -> None: ...
    def guard(self, fn: Callable[..., None], *args: Any) -> None:
        """Run a listener callback; an internal error disables the probe, never the run."""


class Hooks:
    """Installs and removes every patch; holds the originals so removal restores them exactly."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.active = False
        self._restore: list[Callable[[], None]] = []
        self._sync_installed = False
        self.sync_watched = False  # whether the sync watch ran at any time (its counts mean something)
        self._inside = threading.local()  # depth of wrapped sync calls on this thread
        self._ensure_detector: Callable[[], None] | None = None

    # -- helpers ----------------------------------------------------------------------------------
    def patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> Any:
        """Replace ``owner.name`` by ``make(original)``; ``remove`` restores it. Collectors that listen at a
        place of their own patch it through here (``collectors.saves``)."""
        own = name in vars(owner)
        original = vars(owner)[name] if own else getattr(owner, name)
        wrapper = make(original)
        try:
            wrapper.__wrapped__ = original
            wrapper.__name__ = getattr(original, "__name__", name)
            wrapper.__qualname__ = getattr(original, "__qualname__", name)
            wrapper.__doc__ = getattr(original, "__doc__", None)
        except (AttributeError, TypeError):
            pass
        setattr(owner, name, wrapper)
        if own:
            self._restore.append(lambda: setattr(owner, name, original))
        else:  # inherited (e.g. Tensor.item from TensorBase): removing ours uncovers it again
            self._restore.append(lambda: delattr(owner, name))
        return wrapper

    # -- install / remove -------------------------------------------------------------------------
    def install(self) -> None:
        import torch

        listener = self.listener
        compiling = torch.compiler.is_compiling
        capturing = graph_capturing()
        self.active = True
        self._hook_optimizer(listener, compiling, capturing)
        self._hook_loader(listener)
        self._hook_model(listener, compiling, capturing)
        self._hook_forward(listener, compiling)

    def _hook_forward(self, listener: Listener, compiling: Callable[[], bool]) -> None:
        """The outermost training forward: found once by global module hooks (a depth count on each thread),
        then watched by a pre-hook on that module only."""
        import torch
        from torch.nn.modules import module as module_mod

        depth = threading.local()
        grad_enabled = torch.is_grad_enabled
        found: list[Any] = []  # the candidate whose first call is under way
        handles: list[Any] = []

        def report(module: Any, args: Any, kwargs: Any) -> None:
            if self.active and not compiling() and grad_enabled():
                listener.guard(listener.on_forward, module, args, kwargs)

        def discovered(module: Any, args: Any, kwargs: Any) -> None:
            remove_discovery()
            root = module.register_forward_pre_hook(report, with_kwargs=True)
            self._restore.append(root.remove)
            report(module, args, kwargs)  # its first call, counted as it ends (the pre-hook had no kwargs)

        def pre(module: Any, args: Any) -> None:
            if compiling():
                return
            level = getattr(depth, "n", 0)
            depth.n = level + 1
            if level == 0 and not found and self.active and grad_enabled() and _trainable(module):
                found.append(module)
                if "_orig_mod" in getattr(module, "_modules", {}):  # torch.compile'd: discovered before it
                    # compiles what it calls with these global hooks in place (dynamo guards on them: removing
                    # them after would compile every frame again); its first call is counted without kwargs
                    listener.guard(discovered, module, args, {})

        def post(module: Any, args: Any, *rest: Any) -> None:
            if compiling():
                return
            depth.n = max(0, getattr(depth, "n", 1) - 1)
            if found and depth.n == 0 and module is found[0]:
                kwargs = rest[0] if len(rest) == 2 else {}  # an exception's call passes no kwargs
                listener.guard(discovered, module, args, kwargs)

        handles.append(module_mod.register_module_forward_pre_hook(pre))
        handles.append(module_mod.register_module_forward_hook(post, with_kwargs=True, always_call=True))

        # torch.compile'd modules warn at each call while global hooks exist: not the job's warning to see
        warnings.filterwarnings("ignore", message=_COMPILE_HOOK_WARNING, category=UserWarning)
        quiet = [warnings.filters[0]]

        def remove_discovery() -> None:
            while handles:
                handle = handles.pop()
                handle.remove()
                # torch's handle leaves its id in the with_kwargs table, which keeps _has_any_global_hook() true
                module_mod._global_forward_hooks_with_kwargs.pop(handle.id, None)
            while quiet:
                with contextlib.suppress(ValueError):
                    warnings.filters.remove(quiet.pop())  # type: ignore[attr-defined]
                    warnings._filters_mutated()  # type: ignore[attr-defined]

        self._restore.append(remove_discovery)

    def _hook_optimizer(
        self, listener: Listener, compiling: Callable[[], bool], capturing: Callable[[], bool]
    ) -> None:
        """Optimizer steps, through torch's global step hooks (nothing of ours to unwrap)."""
        from torch.optim import optimizer as optim_mod

        def on_step(opt: Any, starting: bool) -> None:
            if self.active and not compiling() and not capturing():
                listener.guard(listener.on_optimizer, opt, starting)
                if self._ensure_detector is not None:
                    self._ensure_detector()

        pre = optim_mod.register_optimizer_step_pre_hook(lambda opt, args, kwargs: on_step(opt, True))
        post = optim_mod.register_optimizer_step_post_hook(lambda opt, args, kwargs: on_step(opt, False))
        self._restore += [pre.remove, post.remove]

    def _hook_loader(self, listener: Listener) -> None:
        """The DataLoader: its iterators' creation, the time each batch blocks, and a single-process
        loader's collate."""
        import torch.utils.data.dataloader as dl

        def make_iter_init(original: Any) -> Any:
            def __init__(it: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
                original(it, loader, *args, **kwargs)
                if self.active:
                    listener.guard(listener.on_iterator, it, loader)

            return __init__

        self.patch(dl._BaseDataLoaderIter, "__init__", make_iter_init)

        def make_single_init(original: Any) -> Any:
            def __init__(it: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
                original(it, loader, *args, **kwargs)
                fetcher: Any = getattr(it, "_dataset_fetcher", None)
                collate = getattr(fetcher, "collate_fn", None)
                if self.active and collate is not None:
                    fetcher.collate_fn = self._timed_collate(collate)

            return __init__

        self.patch(dl._SingleProcessDataLoaderIter, "__init__", make_single_init)

        def make_next(original: Any) -> Any:
            def __next__(it: Any) -> Any:
                if not self.active:
                    return original(it)
                t0 = time.perf_counter()
                batch = original(it)
                listener.guard(listener.on_batch, it, batch, time.perf_counter() - t0)
                return batch

            return __next__

        self.patch(dl._BaseDataLoaderIter, "__next__", make_next)

    def _hook_model(
        self, listener: Listener, compiling: Callable[[], bool], capturing: Callable[[], bool]
    ) -> None:
        """What the model's step runs: backward, SDPA (with or without a mask), autocast and activation
        checkpointing."""
        import torch

        def make_backward(original: Any) -> Any:
            def backward(*args: Any, **kwargs: Any) -> Any:
                if not self.active or compiling() or capturing():
                    return original(*args, **kwargs)
                listener.guard(listener.on_backward, True)
                try:
                    return original(*args, **kwargs)
                finally:
                    listener.guard(listener.on_backward, False)

            return backward

        self.patch(torch.autograd, "backward", make_backward)

        def make_sdpa(original: Any) -> Any:
            def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> Any:
                if self.active and not compiling():
                    mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
                    listener.guard(listener.on_sdpa, mask is not None)
                return original(*args, **kwargs)

            return scaled_dot_product_attention

        sdpa = self.patch(torch.nn.functional, "scaled_dot_product_attention", make_sdpa)
        with contextlib.suppress(Exception):  # TorchScript keeps seeing the aten builtin it wraps
            torch.jit._builtins._register_builtin(sdpa, "aten::scaled_dot_product_attention")

        def make_autocast_enter(original: Any) -> Any:
            def __enter__(ctx: Any) -> Any:
                result = original(ctx)
                if self.active and not compiling():
                    listener.guard(
                        listener.on_autocast,
                        str(getattr(ctx, "device", "")),
                        getattr(ctx, "fast_dtype", None),
                        bool(getattr(ctx, "_enabled", True)),
                    )
                return result

            return __enter__

        self.patch(torch.amp.autocast_mode.autocast, "__enter__", make_autocast_enter)

        import torch.utils.checkpoint as ckpt

        def make_checkpoint(original: Any) -> Any:
            def checkpoint(*args: Any, **kwargs: Any) -> Any:
                if self.active and not compiling():
                    listener.guard(listener.on_checkpoint)
                return original(*args, **kwargs)

            return checkpoint

        self.patch(ckpt, "checkpoint", make_checkpoint)

    def install_sync_watch(self) -> None:
        """Count, time and locate the calls that block the host on a CUDA device (GPU runs only)."""
        if self._sync_installed:
            return
        import torch

        self._sync_installed = True
        self.sync_watched = True
        for name, kind in _TENSOR_SYNCS.items():
            self.patch(torch.Tensor, name, functools.partial(self._timed_sync, kind=kind))
        self.patch(torch, "nonzero", lambda original: self._timed_sync(original, "nonzero"))
        for name in ("to", "cuda"):
            self.patch(torch.Tensor, name, self._timed_copy)
        self.patch(
            torch.cuda, "synchronize", lambda original: self._timed_sync(original, "synchronize", False)
        )
        for owner in (torch.cuda.Stream, torch.cuda.Event):
            self.patch(
                owner, "synchronize", lambda original: self._timed_sync(original, "synchronize", False)
            )
        self._install_sync_detector(torch)

    def _timed_sync(self, original: Any, kind: str, tensor_first: bool = True) -> Any:
        """A wrapper that times ``original`` when it runs on a CUDA tensor (or always, for synchronize)."""
        import torch

        compiling = torch.compiler.is_compiling
        capturing = graph_capturing()

        def method(*args: Any, **kwargs: Any) -> Any:
            if (
                not self.active
                or (tensor_first and not (args and getattr(args[0], "is_cuda", False)))
                or self._depth()  # nested (a subclass re-dispatching): counted once
                or compiling()
                or capturing()
            ):
                return original(*args, **kwargs)
            return self._timed(kind, original, args, kwargs)

        return method

    def _depth(self) -> int:
        return int(getattr(self._inside, "depth", 0))

    def _timed(self, kind: str, original: Any, args: Any, kwargs: Any) -> Any:
        inside = self._inside
        inside.depth = getattr(inside, "depth", 0) + 1
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds = time.perf_counter() - t0
            inside.depth -= 1
            site = call_site(sys._getframe(1))
            if site is not None:
                self.listener.guard(self.listener.on_sync, seconds, kind, site)

    def _timed_copy(self, original: Any) -> Any:
        """``Tensor.to`` / ``.cuda``: a copy between host and device without ``non_blocking=True`` blocks the
        host until it (and all work queued before it) is done, even from pinned memory."""
        import torch

        compiling = torch.compiler.is_compiling
        capturing = graph_capturing()

        dtype = torch.dtype

        def method(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if (
                not self.active
                or (args and type(args[0]) is dtype and "device" not in kwargs)  # a cast: the common case
                or self._depth()
                or compiling()
                or capturing()
            ):
                return original(tensor, *args, **kwargs)
            source = tensor.device.type
            inside = self._inside
            inside.depth = self._depth() + 1
            t0 = time.perf_counter()
            try:
                result = original(tensor, *args, **kwargs)
            finally:
                seconds = time.perf_counter() - t0
                inside.depth -= 1
            target = getattr(getattr(result, "device", None), "type", source)
            if target == source or "cuda" not in (source, target):
                return result  # a cast or a move that does not involve the GPU
            non_blocking = bool(kwargs.get("non_blocking", False)) or any(
                isinstance(a, bool) and a for a in args[:3]
            )
            if source == "cpu":
                self.listener.guard(self.listener.on_copy, bool(tensor.is_pinned()), non_blocking)
            if not non_blocking:
                site = call_site(sys._getframe(1))
                if site is not None:
                    kind = "copy_to_device" if source == "cpu" else "copy_to_host"
                    self.listener.guard(self.listener.on_sync, seconds, kind, site)
            return result

        return method

    def _install_sync_detector(self, torch: Any) -> None:
        """torch's sync debug mode in "warn": its warnings are counted here and never shown."""
        try:
            previous = int(torch.cuda.get_sync_debug_mode())
            torch.cuda.set_sync_debug_mode("warn")
        except Exception:  # a build without it: the wrapped calls are still counted
            return
        shown = [warnings.showwarning]  # whoever showed warnings before us (re-read if replaced later)
        hooks = self

        def showwarning(message: Any, category: Any, filename: str, lineno: int, *rest: Any) -> None:
            if SYNC_WARNING not in str(message):
                shown[0](message, category, filename, lineno, *rest)
                return
            if hooks.active and not hooks._depth():
                site = call_site(sys._getframe(1))
                if site is not None:
                    hooks.listener.guard(hooks.listener.on_sync, None, "other", site)
            if previous:  # the job asked for these warnings itself
                shown[0](message, category, filename, lineno, *rest)

        def ensure() -> None:
            """Stay in front when the job installs its own handler later (``logging.captureWarnings``)."""
            current = warnings.showwarning
            if current is not showwarning:
                shown[0] = current
                warnings.showwarning = showwarning  # type: ignore[assignment]

        ensure()
        warnings.filterwarnings("always", message=SYNC_WARNING)
        added = warnings.filters[0]
        self._ensure_detector = ensure

        def undo() -> None:
            self._ensure_detector = None
            torch.cuda.set_sync_debug_mode(previous)
            if warnings.showwarning is showwarning:
                warnings.showwarning = shown[0]
            with contextlib.suppress(Exception):
                warnings.filters.remove(added)  # type: ignore[attr-defined]
                warnings._filters_mutated()  # type: ignore[attr-defined]

        self._restore.append(undo)

    def _timed_collate(self, collate: Any) -> Any:
        listener = self.listener

        def collate_fn(samples: Any) -> Any:
            if not self.active:
                return collate(samples)
            t0 = time.perf_counter()
            batch = collate(samples)
            listener.guard(listener.on_collate, samples, time.perf_counter() - t0)
            return batch

        collate_fn.__wrapped__ = collate  # type: ignore[attr-defined]
        return collate_fn

    def remove(self) -> None:
        """Restore every original, newest first. Safe to call twice."""
        self.active = False
        while self._restore:
            undo = self._restore.pop()
            with contextlib.suppress(Exception):  # restoring an attribute does not fail in practice
                undo()
        self._sync_installed = False


def _trainable(module: Any) -> bool:
    return any(p.requires_grad for p in module.parameters())


def graph_capturing() -> Callable[[], bool]:
    """A cheap test for "the current CUDA stream is being captured into a CUDA graph"."""
    import torch

    cuda = torch.cuda

    def capturing() -> bool:
        return bool(cuda.is_initialized() and cuda.is_current_stream_capturing())

    return capturing


def call_site(frame: Any) -> str | None:
    """ "file.py:line in function" of the first frame outside torch, the warnings module and these hooks;
    None when that frame is the probe's own (its syncs are not the job's)."""
    skip = _skipped_files()
    depth = 0
    while frame is not None and depth < 32:
        filename = frame.f_code.co_filename
        if not filename.startswith(skip):
            return None if filename.startswith(os.path.join(_PITSTOP_DIR, "probe")) else _site(frame)
        frame, depth = frame.f_back, depth + 1
    return None


@functools.cache
def _skipped_files() -> tuple[str, ...]:
    import torch

    return (os.path.dirname(torch.__file__), warnings.__file__, __file__)


def _site(frame: Any) -> str:
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"
