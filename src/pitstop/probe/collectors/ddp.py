"""DistributedDataParallel's settings and whether its unused-parameter search is needed: the wrapper's
``find_unused_parameters`` and ``static_graph``, who asked for the search and the job's line, the host time the
search took in the measured steps, and the parameters that got no gradient on some rank.

Three patches on DDP's own methods, through the probe's hooks (restored with them), each handing every call on
unchanged:

* ``_ddp_init_helper`` (called once from DDP's constructor): notes the wrapper, the names of the parameters in
  the reducer's order, the job's line that built it and who asked for the search, read off the call stack (a
  Transformers Trainer's ``ddp_find_unused_parameters``, Lightning's ``DDPStrategy``, Accelerate's
  ``DistributedDataParallelKwargs``, else the job's own ``DistributedDataParallel(...)``). Not ``__init__``:
  the collectives collector wraps that one, and two wrappers of one attribute would not unwind cleanly.
* ``_post_forward``: where DDP walks the autograd graph from the outputs (``prepare_for_backward``) when the
  search is on; timed on the host in the measured steps. A wrapper built before the probe came is noted here.
* at each step's end the reducer's used-parameter map (``_get_local_used_map``): after every backward with the
  search on, DDP all-reduces one count per parameter of the ranks that used it, so a count below the world size
  is a parameter some rank left without a gradient. Read as it stands (no copy to the host until the window
  ends); the map exists only while the search is on, the only case that needs it.
"""

from __future__ import annotations

import os
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from pitstop.core.profile import DdpSettings, RankProfile, StepRecord
from pitstop.probe.collectors.base import Collector, ProbeContext, collector

PITSTOP_DIR = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))  # .../pitstop: not the job's line
# libraries that build the wrapper for the job: the job's line is the first frame outside them
LIBRARIES = (
    "torch",
    "transformers",
    "accelerate",
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "trl",
)
UNUSED_NAMES = 5  # unused parameters named in the profile, at most


def _top_module(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__", "") or "").split(".", 1)[0]


def _classes(obj: Any) -> set[str]:
    return {c.__name__ for c in type(obj).__mro__}


def who_set(frame: FrameType | None, find_unused: bool) -> tuple[str | None, str | None]:
    """Who asked DDP for the search and the job's own line, from the stack of DDP's constructor (or of its
    forward, for a wrapper built before the probe): (set_by, "file:line")."""
    site: str | None = None
    trainer = strategy = accelerator = None
    while frame is not None:
        top = _top_module(frame)
        if top in LIBRARIES or frame.f_code.co_filename.startswith(PITSTOP_DIR):
            this = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
            if this is not None:
                names = _classes(this)
                if top in ("transformers", "trl") and "Trainer" in names and trainer is None:
                    trainer = this
                elif "DDPStrategy" in names and strategy is None:
                    strategy = this
                elif top == "accelerate" and "Accelerator" in names and accelerator is None:
                    accelerator = this
        elif site is None:
            site = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    if not find_unused:
        return None, site
    if trainer is not None:
        args = getattr(trainer, "args", None)
        value = getattr(args, "ddp_find_unused_parameters", None)
        if value is None:
            return (
                "the Trainer's default (ddp_find_unused_parameters=None: on unless the model is a "
                "PreTrainedModel with gradient checkpointing)",
                site,
            )
        return f"{type(args).__name__}(ddp_find_unused_parameters={value})", site
    if strategy is not None:
        return (
            "Lightning's DDPStrategy(find_unused_parameters=True) "
            '(strategy="ddp_find_unused_parameters_true")',
            site,
        )
    if accelerator is not None:
        return "Accelerate's DistributedDataParallelKwargs(find_unused_parameters=True)", site
    return "DistributedDataParallel(find_unused_parameters=True)", site


@dataclass
class _Wrapper:
    """One DDP module the job built: what it was asked, and what the window counted."""

    module: Callable[[], Any]  # a weak reference: the probe never keeps a model alive
    world: int
    find_unused: bool
    static_graph: bool
    set_by: str | None = None
    site: str | None = None
    names: list[str] | None = None  # parameter names in the reducer's order (seen at construction)
    searched: bool = False  # a forward searched since the map was last read
    unused: Any = None  # bool tensor, one per reducer parameter: under the world size in a measured step
    invalid: Any = None  # bool tensor: a map read outside 0..world (not yet written): the count is void
    reads: int = 0
    search_s: float = 0.0
    searches: int = 0

    @property
    def searching(self) -> bool:
        return self.find_unused and not self.static_graph


def _world(module: Any) -> int:
    group = getattr(module, "process_group", None)
    size = getattr(group, "size", None)
    if callable(size):
        return int(size())
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else 1


def _reducer_params(parameters: Any) -> list[Any]:
    """The reducer's parameter list as ``_ddp_init_helper`` receives it (older torch: one list per replica)."""
    params = list(parameters) if parameters is not None else []
    if params and isinstance(params[0], list | tuple):
        params = list(params[0])
    return params


@collector
class DdpCollector(Collector):
    """The counters live on each wrapper noted (``_Wrapper``); ``fill`` writes the one that searched most."""

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self._wrappers: dict[int, _Wrapper] = {}  # id(module) -> what was noted of it
        self._counting = False

    def install(self) -> None:
        import torch
        import torch.distributed as dist

        if not dist.is_available():
            return
        from torch.nn.parallel import DistributedDataParallel as DDP

        compiling = torch.compiler.is_compiling
        hooks = self.ctx.hooks
        guard = hooks.listener.guard

        def make_init(original: Any) -> Any:
            def _ddp_init_helper(module: Any, parameters: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(module, parameters, *args, **kwargs)
                if hooks.active:
                    guard(self._built, module, parameters, sys._getframe(1))
                return result

            return _ddp_init_helper

        def make_post(original: Any) -> Any:
            def _post_forward(module: Any, output: Any) -> Any:
                if not hooks.active or compiling():
                    return original(module, output)
                t0 = time.perf_counter()
                result = original(module, output)
                guard(self._forward, module, time.perf_counter() - t0)
                return result

            return _post_forward

        if callable(getattr(DDP, "_ddp_init_helper", None)):
            hooks.patch(DDP, "_ddp_init_helper", make_init)
        if callable(getattr(DDP, "_post_forward", None)):
            hooks.patch(DDP, "_post_forward", make_post)

    # -- what the patches report ------------------------------------------------------------------
    def _note(self, module: Any, frame: FrameType | None) -> _Wrapper:
        find_unused = bool(getattr(module, "find_unused_parameters", False))
        set_by, site = who_set(frame, find_unused)
        wrapper = _Wrapper(
            module=weakref.ref(module),
            world=_world(module),
            find_unused=find_unused,
            static_graph=bool(getattr(module, "static_graph", False)),
            set_by=set_by,
            site=site,
        )
        self._wrappers[id(module)] = wrapper
        return wrapper

    def _built(self, module: Any, parameters: Any, frame: FrameType | None) -> None:
        wrapper = self._note(module, frame)
        names = {id(p): n for n, p in module.module.named_parameters()}
        listed = [names.get(id(p)) for p in _reducer_params(parameters)]
        wrapper.names = [n for n in listed if n is not None] if all(listed) else None

    def _forward(self, module: Any, seconds: float) -> None:
        import torch

        wrapper = self._wrappers.get(id(module))
        if wrapper is None or wrapper.module() is not module:  # built before the probe (or an id reused)
            wrapper = self._note(module, sys._getframe(2))
        wrapper.find_unused = bool(getattr(module, "find_unused_parameters", False))
        wrapper.static_graph = bool(getattr(module, "static_graph", False))
        synced = torch.is_grad_enabled() and bool(getattr(module, "require_backward_grad_sync", True))
        if not (wrapper.searching and synced):
            return
        wrapper.searched = True
        if self._counting:
            wrapper.search_s += seconds
            wrapper.searches += 1

    # -- the window -------------------------------------------------------------------------------
    def start_window(self) -> None:
        for wrapper in self._wrappers.values():
            wrapper.unused = wrapper.invalid = None
            wrapper.reads = wrapper.searches = 0
            wrapper.search_s = 0.0
        self._counting = True

    def step_end(self, record: StepRecord) -> None:
        """After the optimizer step the last backward's all-reduced map is complete (DDP waits for it at the
        backward's end): read it for each wrapper that searched in this step."""
        for wrapper in self._wrappers.values():
            if not wrapper.searched:
                continue
            wrapper.searched = False
            module = wrapper.module()
            if self._counting and module is not None and wrapper.searching:
                self._read_map(wrapper, module)

    def _read_map(self, wrapper: _Wrapper, module: Any) -> None:
        read = getattr(getattr(module, "reducer", None), "_get_local_used_map", None)
        if not callable(read):
            return
        used = read()
        if used is None or used.numel() == 0:
            return
        short = used < wrapper.world
        invalid = ((used < 0) | (used > wrapper.world)).any()
        if wrapper.unused is None:
            wrapper.unused, wrapper.invalid = short, invalid
        else:
            wrapper.unused.logical_or_(short)
            wrapper.invalid.logical_or_(invalid)
        wrapper.reads += 1

    def stop_window(self) -> None:
        self._counting = False

    def fill(self, draft: RankProfile) -> None:
        if not self._wrappers:
            return
        wrappers = list(self._wrappers.values())
        main = max(wrappers, key=lambda w: (w.searches, w.searching, -wrappers.index(w)))
        settings = DdpSettings(
            find_unused_parameters=main.find_unused,
            static_graph=main.static_graph,
            set_by=main.set_by,
            site=main.site,
            search_s=main.search_s if main.searching else None,
            searches=main.searches,
        )
        module = main.module()
        if main.names is not None:
            settings.parameters = len(main.names)
        elif module is not None:
            settings.parameters = sum(1 for p in module.module.parameters() if p.requires_grad)
        if main.unused is not None and main.invalid is not None and not bool(main.invalid.item()):
            flags = main.unused.cpu().tolist()
            settings.parameters = len(flags)
            settings.unused_parameters = sum(1 for f in flags if f)
            if main.names is not None and len(main.names) == len(flags):
                settings.unused_names = [n for n, f in zip(main.names, flags, strict=True) if f][
                    :UNUSED_NAMES
                ]
        draft.ddp = settings
