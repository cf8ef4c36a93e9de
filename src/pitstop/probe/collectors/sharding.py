"""Sharding frameworks at work: which one shards the model (FSDP1, FSDP2, DeepSpeed ZeRO) and how, the model's
parameter tensors it handles one by one or unit by unit (how many are small), and the host time spent inside
its hooks in the measured steps.

Where a full replica fits, every one of those hook calls is work DDP never does: DDP all-reduces the gradients
in 25 MB buckets from its reducer, with no per-module hook before a forward or after a backward. The hooks
are timed at the framework's own entry points, patched through the probe's hooks (restored with them), each
call handed on unchanged and timed with ``perf_counter`` only while the window counts (the outermost call on
a thread: a hook that calls another is counted once). What the hooks wait for (an all-gather a gloo or a
blocking call finishes inside the hook) is in their time; on a GPU a collective the hook only launches is not.

* FSDP2 (``fully_shard``): ``FSDPState._pre_forward`` / ``_post_forward`` (bound when a module is sharded,
  so patched as soon as ``torch.distributed.fsdp`` is imported), ``_pre_backward``, the root's final
  backward callback, and ``FSDPParamGroup.post_backward`` (the reduce-scatter);
* FSDP1 (``FullyShardedDataParallel``): the runtime's ``_pre_forward`` / ``_post_forward`` /
  ``_root_pre_forward`` as the wrapper's forward calls them, ``_pre_backward_hook`` / ``_post_backward_hook``
  (registered again at every forward) and the final backward callback;
* DeepSpeed: ZeRO-3's per-module fetch and release (``DeepSpeedZeRoOffload``'s four sub-module functions)
  and each stage's per-parameter gradient hook (``reduce_ready_partitions_and_remove_grads``).

The parameter tensors are counted once, at the first optimizer step, unsharded: an FSDP2 parameter is a
DTensor of the global shape, an FSDP1 flat parameter lists the tensors it holds (``_numels``), a ZeRO-3
parameter its ``ds_numel``."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pitstop.core.profile import RankProfile, ShardingStats
from pitstop.core.vocabulary import Sharding
from pitstop.probe.bootstrap import after_import
from pitstop.probe.collectors.base import ProbeContext, WindowCounts, collector

SMALL_ELEMENTS = 65_536  # a tensor under this many elements is small: a norm's weight, a bias, a small head

# module -> (class or None for the module itself, the functions to time, the framework they belong to)
TARGETS: dict[str, tuple[str | None, tuple[str, ...], str]] = {
    "torch.distributed.fsdp._fully_shard._fsdp_state": (
        "FSDPState",
        ("_pre_forward", "_post_forward", "_pre_backward", "_root_post_backward_final_callback"),
        "fsdp2",
    ),
    "torch.distributed.fsdp._fully_shard._fsdp_param_group": ("FSDPParamGroup", ("post_backward",), "fsdp2"),
    "torch.distributed.fsdp.fully_sharded_data_parallel": (
        None,
        ("_pre_forward", "_post_forward", "_root_pre_forward"),
        "fsdp1",
    ),
    "torch.distributed.fsdp._runtime_utils": (
        None,
        ("_pre_backward_hook", "_post_backward_hook", "_post_backward_final_callback"),
        "fsdp1",
    ),
    "deepspeed.runtime.zero.parameter_offload": (
        "DeepSpeedZeRoOffload",
        (
            "pre_sub_module_forward_function",
            "post_sub_module_forward_function",
            "pre_sub_module_backward_function",
            "post_sub_module_backward_function",
        ),
        "deepspeed",
    ),
    "deepspeed.runtime.zero.stage_1_and_2": (
        "DeepSpeedZeroOptimizer",
        ("reduce_ready_partitions_and_remove_grads",),
        "deepspeed",
    ),
    "deepspeed.runtime.zero.stage3": (
        "DeepSpeedZeroOptimizer_Stage3",
        ("reduce_ready_partitions_and_remove_grads",),
        "deepspeed",
    ),
}


@dataclass
class HookTime:
    seconds: float = 0.0
    calls: int = 0


@dataclass
class Layout:
    """What the model's sharding looks like, read once at the first optimizer step."""

    framework: str
    strategy: str | None
    units: int | None
    tensors: int
    small: int
    param_bytes: int
    grad_bytes: int


def _numels(p: Any) -> list[int]:
    """The unsharded tensors one parameter stands for: FSDP1's flat parameter's originals, a ZeRO-3
    parameter's full size, else the parameter itself (a DTensor counts its global shape)."""
    originals = getattr(p, "_numels", None)
    if originals is not None and getattr(p, "_is_flat_param", False):
        return [int(n) for n in originals]
    ds = getattr(p, "ds_numel", None)
    return [int(ds)] if ds is not None else [int(p.numel())]


def _fsdp2_strategy(state: Any) -> str:
    """FULL_SHARD when a unit other than the root reshards after forward, else SHARD_GRAD_OP; HYBRID_SHARD on
    a two-dimensional mesh."""
    resharding = hybrid = False
    for group in getattr(state, "_fsdp_param_groups", None) or ():
        mesh = getattr(group, "mesh_info", None)
        hybrid = hybrid or type(mesh).__name__ == "HSDPMeshInfo"
        resharding = resharding or getattr(group, "post_forward_mesh_info", None) is not None
    if hybrid:
        return str(Sharding.HYBRID_SHARD)
    return str(Sharding.FULL_SHARD if resharding else Sharding.SHARD_GRAD_OP)


def layout(model: Any, zero_stage: int | None) -> Layout | None:
    """The framework, strategy, units and parameter tensors of ``model``; None when nothing shards it."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    fsdp1 = getattr(fsdp, "FullyShardedDataParallel", None)
    fsdp2 = getattr(fsdp, "FSDPModule", None)
    framework: str | None = None
    strategies: list[str] = []
    units = 0
    for module in model.modules():
        if fsdp2 is not None and isinstance(module, fsdp2):
            framework, units = "fsdp2", units + 1
            strategies.append(_fsdp2_strategy(module._get_fsdp_state()))
        elif fsdp1 is not None and isinstance(module, fsdp1):
            framework, units = "fsdp1", units + 1
            found = Sharding.parse(getattr(getattr(module, "sharding_strategy", None), "name", None))
            if found is not None:
                strategies.append(str(found))
    params = list(model.parameters())
    if framework is None and (zero_stage or any(hasattr(p, "ds_numel") for p in params[:64])):
        framework = "deepspeed" if "deepspeed" in sys.modules else None
    if framework is None:
        return None
    if framework == "deepspeed":
        strategy: str | None = f"zero{zero_stage}" if zero_stage else None
    else:  # the commonest strategy among the units (the root often keeps its parameters)
        strategy = max(set(strategies), key=strategies.count) if strategies else None
        if str(Sharding.FULL_SHARD) in strategies:
            strategy = str(Sharding.FULL_SHARD)
    tensors = small = param_bytes = grad_bytes = 0
    for p in params:
        size = int(p.element_size())
        for n in _numels(p):
            tensors += 1
            small += n < SMALL_ELEMENTS
            param_bytes += n * size
            grad_bytes += n * size if p.requires_grad else 0
    return Layout(framework, strategy, units or None, tensors, small, param_bytes, grad_bytes)


def rank_memory(environment_gpu_bytes: int | None) -> int | None:
    """The memory one rank may use: its GPU's, or on a CPU the host's physical memory over the ranks on it."""
    if environment_gpu_bytes:
        return environment_gpu_bytes
    with contextlib.suppress(ValueError, OSError, AttributeError):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        local = os.environ.get("LOCAL_WORLD_SIZE", "1")
        return int(total // max(int(local) if local.isdigit() else 1, 1))
    return None


@collector
class ShardingCollector(WindowCounts[HookTime]):
    counts_type = HookTime

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self._counting = False
        self._inside = threading.local()
        self._layout: Layout | None = None
        self._patched: set[str] = set()

    def install(self) -> None:
        for name in TARGETS:
            after_import(name, self._patch_module)

    def _patch_module(self, module: Any) -> None:
        """Patch one target module's functions (called as it is imported, or at once when it was)."""
        name = getattr(module, "__name__", "")
        if name in self._patched or not self.ctx.hooks.active:
            return
        self._patched.add(name)
        owner_name, functions, _framework = TARGETS[name]
        owner = getattr(module, owner_name) if owner_name else module
        for function in functions:
            if callable(getattr(owner, function, None)):
                self.ctx.hooks.patch(owner, function, self._timed)

    def _timed(self, original: Callable[..., Any]) -> Callable[..., Any]:
        inside = self._inside

        def hook(*args: Any, **kwargs: Any) -> Any:
            if not self._counting or getattr(inside, "busy", False):
                return original(*args, **kwargs)
            inside.busy = True
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.counts.seconds += time.perf_counter() - started
                self.counts.calls += 1
                inside.busy = False

        return hook

    def begin(self) -> None:
        model = self.ctx.model
        env = self.ctx.environment
        if model is None:
            return
        self._layout = layout(model, env.zero_stage if env is not None else None)

    def start_window(self) -> None:
        super().start_window()
        self._counting = self._layout is not None

    def stop_window(self) -> None:
        self._counting = False

    def fill(self, draft: RankProfile) -> None:
        found = self._layout
        if found is None:
            return
        env = draft.environment
        if found.framework != "deepspeed" and env.fsdp_sharding is None and found.strategy is not None:
            env.fsdp_sharding = found.strategy  # a plain loop's FSDP: no configuration said it
        timed = self.counts.calls > 0 and bool(draft.steps)
        draft.sharding = ShardingStats(
            framework=found.framework,
            strategy=found.strategy,
            units=found.units,
            param_tensors=found.tensors,
            small_tensors=found.small,
            small_elements=SMALL_ELEMENTS,
            param_bytes=found.param_bytes,
            grad_bytes=found.grad_bytes,
            hook_s=self.counts.seconds if timed else None,
            hook_calls=self.counts.calls,
            steps=len(draft.steps),
            memory_bytes=rank_memory(env.gpu_memory_bytes),
        )
