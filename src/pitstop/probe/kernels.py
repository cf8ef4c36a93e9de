"""Which fused paths the run takes: the optimizer's implementation (for-loop, foreach, fused), Liger Kernel
(installed, applied to this model), torch.compile. Read once at the first optimizer step from the objects the
run made; nothing is changed."""

from __future__ import annotations

import importlib.util
from typing import Any

from pitstop.core.profile import KernelFacts


def _resolved_foreach(optimizer: Any, fused: bool | None, foreach: bool | None) -> bool | None:
    """torch's default when the constructor left ``foreach`` at None: foreach for CUDA parameters."""
    if fused or foreach is not None:
        return bool(foreach) and not fused
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach

        params = [p for g in optimizer.param_groups for p in g["params"]]
        differentiable = bool(optimizer.defaults.get("differentiable", False))
        return bool(_default_to_fused_or_foreach(params, differentiable, use_fused=False)[1])
    except Exception:  # a private helper: gone in some torch version, the answer stays unknown
        return None


def _liger_applied(model: Any) -> bool:
    if model is None:
        return False
    forward = getattr(type(model), "forward", None)
    if "liger_kernel" in (getattr(forward, "__module__", "") or ""):
        return True
    for m in model.modules():
        if type(m).__module__.startswith("liger_kernel") or "liger_kernel" in (
            getattr(getattr(m, "forward", None), "__module__", "") or ""
        ):
            return True
    return False


def kernel_facts(optimizer: Any, model: Any, trainer: Any) -> KernelFacts:
    """``optimizer`` None: a loop with no torch optimizer (a hand-written update); its facts stay unknown."""
    defaults = getattr(optimizer, "defaults", {}) or {}
    fused = defaults.get("fused")
    foreach = defaults.get("foreach")
    args = getattr(trainer, "args", None)
    compiled = hasattr(model, "_orig_mod") or bool(getattr(args, "torch_compile", False))
    return KernelFacts(
        optimizer=None if optimizer is None else type(optimizer).__name__,
        optimizer_fused=bool(fused) if "fused" in defaults else None,
        optimizer_foreach=None if optimizer is None else _resolved_foreach(optimizer, fused, foreach),
        liger_installed=importlib.util.find_spec("liger_kernel") is not None,
        liger_applied=_liger_applied(model) or bool(getattr(args, "use_liger_kernel", False)),
        compiled=compiled,
    )
