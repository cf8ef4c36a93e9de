"""Cleanup calls made inside the training loop: ``gc.collect()`` and ``torch.cuda.empty_cache()``, each
counted per measured step, timed, and attributed to where it came from.

Both are wrapped from the probe's installation on; every call is handed on unchanged (same arguments, same
return value, same exception) and, in the window, timed and charged to the step under way, so a job that makes
no such call pays nothing per step. The site is the job's own line: the first frame outside torch, pitstop,
the standard library and the installed packages. When that is not the frame that made the call, a library
made it (``via``: accelerate's ``clear_device_cache`` under ``accelerator.free_memory()``, the Trainer's
``training_step``), and where a setting of the job's asked for it, it is named (the Trainer's
``torch_empty_cache_steps``). ``torch.cuda.synchronize`` is not wrapped here: the sync watch counts it among the
host's waits (``RankProfile.sync_sites``).

An explicit ``gc.collect()`` runs the interpreter's ``gc.callbacks`` too: ``collecting_by_hand()`` tells the
garbage-collector collector which collections these calls ran, so its automatic counts leave them out."""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import threading
from time import perf_counter
from types import FrameType
from typing import Any

from pitstop.core.profile import JobCall, RankProfile
from pitstop.probe.collectors.base import Collector, ProbeContext, collector

PITSTOP_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE_DIR = os.path.join(PITSTOP_DIR, "probe", "")
MAX_DEPTH = 64  # frames looked at for the job's line; a deeper call is charged to the nearest library line
MAX_CALLS = 20  # sites kept per rank, busiest first
PACKAGES = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
TRAINER_STEP = "training_step"  # where the Trainer empties the cache on torch_empty_cache_steps

_by_hand = threading.local()  # depth of wrapped gc.collect calls on this thread


def collecting_by_hand() -> bool:
    """Whether the collection now running on this thread was started by an explicit ``gc.collect()``."""
    return getattr(_by_hand, "depth", 0) > 0


@functools.cache
def _stdlib() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple({os.path.join(paths[k], "") for k in ("stdlib", "platstdlib") if paths.get(k)})


@functools.cache
def _torch_dir() -> str:
    import torch

    return os.path.join(os.path.dirname(torch.__file__), "")


@functools.cache
def _kind(filename: str) -> str:
    """'own' (pitstop), 'torch', 'library' (installed packages, the standard library) or 'job'."""
    if filename.startswith(PITSTOP_DIR):
        return "own"
    if filename.startswith(_torch_dir()):
        return "torch"
    if (
        any(p in filename for p in PACKAGES)
        or filename.startswith(_stdlib())
        or filename.startswith("<frozen")
    ):
        return "library"
    return "job"


def _line(frame: FrameType) -> str:
    """The frame as "path:line in function": the job's file by its path, a library's from its package on."""
    name = frame.f_code.co_filename
    for marker in PACKAGES:
        if marker in name:
            name = name.rsplit(marker, 1)[1]
            break
    return f"{name}:{frame.f_lineno} in {frame.f_code.co_name}"


def _setting(frame: FrameType) -> str | None:
    """The Trainer's ``torch_empty_cache_steps``, read from its ``training_step`` frame's ``self.args``."""
    if frame.f_code.co_name != TRAINER_STEP or "transformers" not in frame.f_code.co_filename:
        return None
    every = getattr(getattr(frame.f_locals.get("self"), "args", None), "torch_empty_cache_steps", None)
    return f"TrainingArguments(torch_empty_cache_steps={every})" if isinstance(every, int) else None


def locate(frame: FrameType | None, call: str) -> tuple[str, str | None, str | None] | None:
    """(site, via, setting) of a call whose wrapper was called from ``frame``; None for pitstop's own."""
    caller: FrameType | None = None
    setting: str | None = None
    depth = 0
    while frame is not None and depth < MAX_DEPTH:
        kind = _kind(frame.f_code.co_filename)
        if kind == "own" and caller is None and frame.f_code.co_filename.startswith(PROBE_DIR):
            return None  # the probe's own call; a trial's wrapper (pitstop.remedies) is passed over
        if kind == "torch" and caller is None:
            return None  # torch's own (dynamo collects after each compile): a recompile, not a cleanup
        if kind == "job":
            if caller is None or caller is frame:
                return _line(frame), None, None
            assert caller is not None
            return _line(frame), _line(caller), setting
        if kind == "library":
            caller = caller or frame
            if setting is None and call == EMPTY_CACHE:
                setting = _setting(frame)
        frame, depth = frame.f_back, depth + 1
    if caller is None:
        return None
    return _line(caller), _line(caller), setting  # no job frame: a library's own loop


GC_COLLECT = "gc.collect"
EMPTY_CACHE = "torch.cuda.empty_cache"


@collector
class JobCallsCollector(Collector):
    """Counters: one ``JobCall`` per (call, site, via, setting), fresh at each window start; None until it
    starts. No per-step work: the wrappers charge each call to the step under way as it returns."""

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.calls: dict[tuple[str, str, str | None, str | None], JobCall] | None = None
        self._last_step: dict[tuple[str, str, str | None, str | None], int] = {}
        self._counting = False

    def install(self) -> None:
        import gc

        import torch

        compiling = torch.compiler.is_compiling
        hooks = self.ctx.hooks

        def make(call: str) -> Any:
            def wrap(original: Any) -> Any:
                def wrapper(*args: Any, **kwargs: Any) -> Any:
                    if compiling():
                        return original(*args, **kwargs)
                    counting = self._counting and hooks.active
                    by_hand = call == GC_COLLECT
                    if by_hand:
                        _by_hand.depth = getattr(_by_hand, "depth", 0) + 1
                    t0 = perf_counter()
                    try:
                        result = original(*args, **kwargs)
                    finally:
                        if by_hand:
                            _by_hand.depth -= 1
                    if counting:
                        seconds = perf_counter() - t0
                        hooks.listener.guard(self._note, call, seconds, result, sys._getframe(1))
                    return result

                return wrapper

            return wrap

        hooks.patch(gc, "collect", make(GC_COLLECT))
        cuda = getattr(torch, "cuda", None)
        for owner in (cuda, getattr(cuda, "memory", None)):
            if owner is not None and callable(vars(owner).get("empty_cache")):
                hooks.patch(owner, "empty_cache", make(EMPTY_CACHE))

    def _note(self, call: str, seconds: float, result: Any, frame: FrameType) -> None:
        calls = self.calls
        if calls is None or not self._counting:
            return
        where = locate(frame, call)
        if where is None:
            return
        key = (call, *where)
        found = calls.get(key)
        if found is None:
            site, via, setting = where
            found = calls[key] = JobCall(call=call, site=site, via=via, setting=setting)
        found.count += 1
        found.seconds += seconds
        if call == GC_COLLECT and isinstance(result, int):
            found.collected += result
        step = self.ctx.step_index()
        if self._last_step.get(key) != step:
            self._last_step[key] = step
            found.steps += 1

    def start_window(self) -> None:
        self.calls = {}
        self._last_step = {}
        self._counting = True

    def stop_window(self) -> None:
        self._counting = False

    def fill(self, draft: RankProfile) -> None:
        if self.calls is None:  # the window never started: nothing was watched
            return
        busiest = sorted(self.calls.values(), key=lambda c: (-c.seconds, -c.count, c.site))
        draft.job_calls = [JobCall(**vars(c)) for c in busiest[:MAX_CALLS]]
