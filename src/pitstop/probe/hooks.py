"""The places the probe listens at, installed on torch and removed again.

Optimizer steps use torch's own global step hooks. The rest are thin wrappers that call the original
first-class function unchanged and report to a listener afterwards: the DataLoader iterator's
``__next__`` (time blocked, what the batch carried), ``torch.autograd.backward``, SDPA and autocast
entry (which attention path and dtype ran), and, on a GPU, the calls that block the host on the device.
A wrapper never alters arguments or results, and under ``torch.compile`` tracing it steps aside.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol


class Listener(Protocol):
    def on_iterator(self, iterator: Any, loader: Any) -> None: ...
    def on_batch(self, iterator: Any, batch: Any, wait_s: float) -> None: ...
    def on_collate(self, samples: Any, seconds: float) -> None: ...
    def on_backward(self, starting: bool) -> None: ...
    def on_optimizer(self, optimizer: Any, starting: bool) -> None: ...
    def on_sdpa(self, has_mask: bool) -> None: ...
    def on_autocast(self, device_type: str, dtype: Any, enabled: bool) -> None: ...
    def on_checkpoint(self) -> None: ...
    def on_sync(self, seconds: float) -> None: ...
    def guard(self, fn: Callable[..., None], *args: Any) -> None:
        """Run a listener callback; an internal error disables the probe, never the run."""


class Hooks:
    """Installs and removes every patch; holds the originals so removal restores them exactly."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.active = False
        self._restore: list[Callable[[], None]] = []
        self._sync_installed = False

    # -- helpers ----------------------------------------------------------------------------------
    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> Any:
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
        import torch.utils.data.dataloader as dl
        from torch.optim import optimizer as optim_mod

        listener = self.listener
        compiling = torch.compiler.is_compiling
        self.active = True

        pre = optim_mod.register_optimizer_step_pre_hook(
            lambda opt, args, kwargs: (
                listener.guard(listener.on_optimizer, opt, True) if self.active else None
            )
        )
        post = optim_mod.register_optimizer_step_post_hook(
            lambda opt, args, kwargs: (
                listener.guard(listener.on_optimizer, opt, False) if self.active else None
            )
        )
        self._restore += [pre.remove, post.remove]

        def make_iter_init(original: Any) -> Any:
            def __init__(it: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
                original(it, loader, *args, **kwargs)
                if self.active:
                    listener.guard(listener.on_iterator, it, loader)

            return __init__

        self._patch(dl._BaseDataLoaderIter, "__init__", make_iter_init)

        def make_single_init(original: Any) -> Any:
            def __init__(it: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
                original(it, loader, *args, **kwargs)
                fetcher: Any = getattr(it, "_dataset_fetcher", None)
                collate = getattr(fetcher, "collate_fn", None)
                if self.active and collate is not None:
                    fetcher.collate_fn = self._timed_collate(collate)

            return __init__

        self._patch(dl._SingleProcessDataLoaderIter, "__init__", make_single_init)

        def make_next(original: Any) -> Any:
            def __next__(it: Any) -> Any:
                if not self.active:
                    return original(it)
                t0 = time.perf_counter()
                batch = original(it)
                listener.guard(listener.on_batch, it, batch, time.perf_counter() - t0)
                return batch

            return __next__

        self._patch(dl._BaseDataLoaderIter, "__next__", make_next)

        def make_backward(original: Any) -> Any:
            def backward(*args: Any, **kwargs: Any) -> Any:
                if not self.active or compiling():
                    return original(*args, **kwargs)
                listener.guard(listener.on_backward, True)
                try:
                    return original(*args, **kwargs)
                finally:
                    listener.guard(listener.on_backward, False)

            return backward

        self._patch(torch.autograd, "backward", make_backward)

        def make_sdpa(original: Any) -> Any:
            def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> Any:
                if self.active and not compiling():
                    mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
                    listener.guard(listener.on_sdpa, mask is not None)
                return original(*args, **kwargs)

            return scaled_dot_product_attention

        sdpa = self._patch(torch.nn.functional, "scaled_dot_product_attention", make_sdpa)
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

        self._patch(torch.amp.autocast_mode.autocast, "__enter__", make_autocast_enter)

        import torch.utils.checkpoint as ckpt

        def make_checkpoint(original: Any) -> Any:
            def checkpoint(*args: Any, **kwargs: Any) -> Any:
                if self.active and not compiling():
                    listener.guard(listener.on_checkpoint)
                return original(*args, **kwargs)

            return checkpoint

        self._patch(ckpt, "checkpoint", make_checkpoint)

    def install_sync_watch(self) -> None:
        """Count and time the calls that block the host on a CUDA device (GPU runs only)."""
        if self._sync_installed:
            return
        import torch

        listener = self.listener
        compiling = torch.compiler.is_compiling
        self._sync_installed = True

        def make_tensor_sync(original: Any) -> Any:
            def method(tensor: Any, *args: Any, **kwargs: Any) -> Any:
                if not self.active or compiling() or not tensor.is_cuda:
                    return original(tensor, *args, **kwargs)
                t0 = time.perf_counter()
                result = original(tensor, *args, **kwargs)
                listener.guard(listener.on_sync, time.perf_counter() - t0)
                return result

            return method

        for name in ("item", "tolist", "cpu"):
            self._patch(torch.Tensor, name, make_tensor_sync)

        def make_device_sync(original: Any) -> Any:
            def synchronize(*args: Any, **kwargs: Any) -> Any:
                if not self.active or compiling():
                    return original(*args, **kwargs)
                t0 = time.perf_counter()
                result = original(*args, **kwargs)
                listener.guard(listener.on_sync, time.perf_counter() - t0)
                return result

            return synchronize

        self._patch(torch.cuda, "synchronize", make_device_sync)

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
