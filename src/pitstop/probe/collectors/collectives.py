"""Collectives: every torch.distributed collective and DDP bucket a rank issues, timed from the probe's
installation on without changing what it computes; each step's counts on its record, the window's records
in the profile, and the job's distributed facts (backend, hosts, transport settings) in the environment.

Mechanism, chosen for being exact and cheap (a few microseconds per collective, and collectives are few per
step: DDP issues one per gradient bucket):

- The Python collectives (``all_reduce``, ``reduce_scatter(_tensor)``, ``all_gather(_into_tensor)``,
  ``broadcast``, ``all_to_all(_single)``, ``reduce``, ``barrier``) are wrapped on ``torch.distributed``: the
  original is called with the caller's arguments and its result is returned untouched. FSDP and DeepSpeed's
  engine issue theirs through these same module functions, so they are seen too. A blocking call is timed by
  the host around it; an asynchronous one gets a completion callback on its work's future (no extra wait).
- DDP's reducer runs its gradient all-reduce in C++, out of reach of those wrappers. At a DDP module's first
  forward, when the user registered no comm hook of their own, the probe registers one that does exactly what
  the reducer's built-in default does (it copies each gradient into the bucket multiplied by 1/world size —
  ``mul_out(bucket, grad, 1/n)`` — then runs a sum all-reduce, async), through the wrapped Python
  ``all_reduce`` — so DDP's buckets are timed like any other collective, with bit-for-bit the same gradients.
  A user's own comm hook is left alone (its collectives go through the wrappers anyway). With
  ``gradient_as_bucket_view=True`` the reducer divides in place (``div_``) from the second step on, which no hook
  can reproduce bit-for-bit, so those buckets stay untimed; so does a model with sparse gradients. DDP's
  buffer broadcast at the start of each forward (C++ too, and where ranks wait for one that was late to its
  batch) is timed around DDP's own Python method that issues it.
- On a GPU the arrival and completion of a collective are CUDA events on the stream that runs it (the
  caller's stream before the call; the completion callback's stream after it), read at the end of the window,
  so the host never waits for the device. The same code runs on the host clock on a CPU, which is what lets the
  GPU path be tested with recorded events.

Each collective carries its process group (the global ranks in it) and its sequence number in that group, so
the same collective can be matched across ranks; aligning ranks' clocks and deciding who waited for whom is
done later, from the records (``pitstop.diagnose.ranks``).

A Python collective issued outside backward also carries the line that issued it (``site``): a metric the job
(or a library on its behalf) reduces every step is a sync point the ranks meet at, outside the gradient
communication (``diagnose/causes/metric_sync.py``). Inside backward (autograd's graph task is running: DDP's
hooks, FSDP's reduce-scatters, a user's comm hook) and when torch or DeepSpeed issued it themselves (FSDP's
forward all-gathers, DTensor), there is no site. Libraries that only pass a collective on for their caller
(accelerate's ``gather``, Lightning's ``self.log(..., sync_dist=True)``, torchmetrics' ``dist_sync_on_step``)
are looked through to the line that called them; the outermost of their calls is kept as ``via``. The stack is
walked only for these (a few microseconds; DDP's buckets never are).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from pitstop.core.profile import CollectiveRecord, Environment, RankProfile, StepRecord
from pitstop.probe import gather
from pitstop.probe.collectors.base import Collector, ProbeContext, collector

MAX_RECORDS = (
    400_000  # a long --full run keeps the first ones; enough for 1,000 steps of a 400-collective FSDP
)
COMM_ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "FI_", "UCX_")

# name on torch.distributed -> (op, index of the tensor(s) whose size is the collective's size)
# Sizes follow nccl-tests: all-gather counts the gathered output, reduce-scatter the full input.
OPS: dict[str, tuple[str, int | None]] = {
    "all_reduce": ("all_reduce", 0),
    "reduce": ("reduce", 0),
    "broadcast": ("broadcast", 0),
    "all_gather": ("all_gather", 0),
    "all_gather_into_tensor": ("all_gather", 0),
    "all_gather_single": ("all_gather", 0),
    "_all_gather_base": ("all_gather", 0),
    "reduce_scatter": ("reduce_scatter", 1),
    "reduce_scatter_tensor": ("reduce_scatter", 1),
    "reduce_scatter_single": ("reduce_scatter", 1),
    "_reduce_scatter_base": ("reduce_scatter", 1),
    "all_to_all": ("all_to_all", 1),
    "all_to_all_single": ("all_to_all", 1),
    "barrier": ("barrier", None),
}


# libraries that pass a collective on for their caller: the line that called them is the site
RELAYS = (
    "accelerate",
    "lightning",
    "lightning_fabric",
    "lightning_utilities",
    "pytorch_lightning",
    "torchmetrics",
)
OWNERS = ("deepspeed", "megatron")  # libraries that communicate for themselves, as torch's FSDP does
MAX_FRAMES = 64  # deeper than any relay chain: a site not found by then is left unknown
PITSTOP_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
STDLIB_DIR = os.path.join(sysconfig.get_paths()["stdlib"], "")
C10D_FILES = ("distributed_c10d.py", "c10d_logger.py")  # torch.distributed's own wrappers around a call


def _library(filename: str) -> str | None:
    """The installed package a file belongs to (the folder after site-packages), or the relay or owner whose
    folder it lies in (a source checkout); None for the job's own files."""
    for marker in (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}"):
        at = filename.rfind(marker)
        if at >= 0:
            return filename[at + len(marker) :].split(os.sep, 1)[0]
    return next((name for name in RELAYS + OWNERS if f"{os.sep}{name}{os.sep}" in filename), None)


def _where(frame: FrameType, filename: str, library: str | None) -> str:
    """ "path:line in Class.function": a library's path from its package, the job's as it ran."""
    if library is not None:
        for marker in (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}"):
            at = filename.rfind(marker)
            if at >= 0:
                filename = filename[at + len(marker) :]
                break
    name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
    return f"{filename}:{frame.f_lineno} in {name}"


def issuing_site(frame: FrameType | None, torch_dir: str) -> tuple[str | None, str | None]:
    """(site, via) of a python collective called from ``frame`` outward, outside backward: the first frame
    past pitstop, the standard library, torch.distributed's own wrappers and the relaying libraries; (None,
    None) when torch itself or a library that communicates for itself (DeepSpeed) issued it."""
    via: str | None = None
    # once a relay was passed, torch frames are only calls on the way (a torchmetrics Metric's Module.__call__)
    relayed = False
    for _ in range(MAX_FRAMES):
        if frame is None:
            break
        filename = frame.f_code.co_filename
        library = _library(filename)
        if filename.startswith(torch_dir):
            if not relayed and not filename.endswith(C10D_FILES):
                return None, None  # FSDP, DTensor, torch.distributed.nn: torch's own communication
        elif filename.startswith(PITSTOP_DIR) or (filename.startswith(STDLIB_DIR) and library is None):
            pass
        elif library in OWNERS and not relayed:
            return None, None
        elif library in RELAYS:
            relayed = True
            via = f"{library}:{getattr(frame.f_code, 'co_qualname', frame.f_code.co_name)}"
        else:
            return _where(frame, filename, library), via
        frame = frame.f_back
    return None, via


def _setter(owner: Any, name: str, value: Any) -> Callable[[], None]:
    return lambda: setattr(owner, name, value)


def nbytes(value: Any) -> int:
    """Bytes of a tensor or a list of tensors (0 for anything else)."""
    if isinstance(value, list | tuple):
        return sum(nbytes(v) for v in value)
    try:
        return int(value.numel()) * int(value.element_size())
    except Exception:
        return 0


class HostMarks:
    """Host seconds since the probe started; every mark is readable at once."""

    clock = "host"

    def __init__(self, origin: float) -> None:
        self.origin = origin

    def mark(self) -> Any:
        return time.perf_counter() - self.origin

    def seconds(self, handle: Any) -> float:
        return float(handle)


class DeviceMarks:
    """CUDA events on the current stream; seconds since the first event, read at the end of the window."""

    clock = "device"

    def __init__(self) -> None:
        import torch

        self._event = torch.cuda.Event
        self._anchor: Any = None

    def mark(self) -> Any:
        event = self._event(enable_timing=True)
        event.record()
        if self._anchor is None:
            self._anchor = event
        return event

    def seconds(self, handle: Any) -> float:
        handle.synchronize()
        return float(self._anchor.elapsed_time(handle)) / 1000.0


@dataclass
class _Open:
    """A collective being timed: marks are clock handles until resolved."""

    step: int
    op: str
    group: str
    seq: int
    bytes: int
    size: int
    issued: Any
    clock: Any
    source: str
    host_t0: float
    done: Any = None
    blocked_s: float | None = None
    site: str | None = None
    via: str | None = None


class CollectiveRecorder:
    """Wraps torch.distributed's collectives and DDP's reducer; keeps one record per collective."""

    def __init__(self, origin: float, step: Callable[[], int], fail: Callable[[BaseException], None]) -> None:
        self.origin = origin
        self.step = step  # index of the step being run (the builder's open step)
        self.fail = fail
        self.marks: Any = HostMarks(origin)
        self.active = False
        self.records: list[_Open] = []
        self.dropped = 0
        self.errors: list[str] = []
        self._restore: list[Callable[[], None]] = []
        self._groups: dict[int, tuple[Any, str, int]] = {}  # id(group) -> (group, key, size)
        self._seq: dict[str, int] = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        self._step_count = 0
        self._step_bytes = 0
        self._step_blocked = 0.0
        self._torch_dir = ""
        self._graph_task: Callable[[], int] | None = None  # autograd's running graph task (-1: none)

    # -- install / remove -------------------------------------------------------------------------
    def install(self) -> None:
        import torch.distributed as dist

        if not dist.is_available():
            return
        import torch
        import torch.distributed.distributed_c10d as c10d

        self._torch_dir = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "")
        self._graph_task = getattr(torch._C, "_current_graph_task_id", None)
        self.active = True
        for name, (op, tensor_at) in OPS.items():
            original = getattr(c10d, name, None)
            if original is None:
                continue
            try:
                wrapper = self._wrap(original, op, tensor_at)
            except (TypeError, ValueError):  # a signature this torch does not expose: leave that one alone
                continue
            for owner in (c10d, dist):
                if getattr(owner, name, None) is original:
                    setattr(owner, name, wrapper)
                    self._restore.append(_setter(owner, name, original))
        try:
            self._install_ddp()
        except Exception as exc:  # a DDP this code does not know: its buckets stay untimed
            self.errors.append(f"DDP buckets not timed: {type(exc).__name__}: {exc}")

    def remove(self) -> None:
        self.active = False
        while self._restore:
            with contextlib.suppress(Exception):
                self._restore.pop()()

    def notes(self) -> list[str]:
        """What the recorder could not do, for the rank's probe_errors."""
        dropped = (
            [f"{self.dropped} collectives after the first {MAX_RECORDS:,} were not recorded"]
            if self.dropped
            else []
        )
        return self.errors + dropped

    def use_device_clock(self) -> None:
        """From now on, mark collectives with CUDA events (the probe learns at step 1 that it is on a GPU)."""
        self.marks = DeviceMarks()

    # -- wrappers ---------------------------------------------------------------------------------
    def _wrap(self, original: Callable[..., Any], op: str, tensor_at: int | None) -> Callable[..., Any]:
        params = list(inspect.signature(original).parameters)
        group_at = params.index("group") if "group" in params else None
        async_at = params.index("async_op") if "async_op" in params else None
        tensor_name = params[tensor_at] if tensor_at is not None and tensor_at < len(params) else None
        recorder = self
        local = self._local

        def collective(*args: Any, **kwargs: Any) -> Any:
            if not recorder.active or getattr(local, "depth", False):
                return original(*args, **kwargs)  # not observing, or a collective inside a collective
            try:
                pending = recorder._begin(op, args, kwargs, tensor_at, tensor_name, group_at)
            except Exception as exc:
                recorder._failed(exc)
                return original(*args, **kwargs)
            local.depth = True
            try:
                result = original(*args, **kwargs)
            finally:
                local.depth = False
            asynchronous = bool(
                kwargs.get(
                    "async_op", args[async_at] if async_at is not None and len(args) > async_at else False
                )
            )
            try:
                recorder._end(pending, result, asynchronous)
            except Exception as exc:
                recorder._failed(exc)
            return result

        collective.__wrapped__ = original  # type: ignore[attr-defined]
        collective.__name__ = original.__name__
        collective.__qualname__ = original.__qualname__
        collective.__doc__ = original.__doc__
        return collective

    def _group(self, group: Any) -> tuple[str, int]:
        import torch.distributed as dist

        if group is None:
            group = dist.group.WORLD
        cached = self._groups.get(id(group))
        if cached is not None and cached[0] is group:
            return cached[1], cached[2]
        try:
            ranks = dist.get_process_group_ranks(group)
        except Exception:
            ranks = list(range(dist.get_world_size(group)))
        key = ",".join(str(r) for r in ranks)
        self._groups[id(group)] = (group, key, len(ranks))
        return key, len(ranks)

    def _begin(
        self,
        op: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        tensor_at: int | None,
        tensor_name: str | None,
        group_at: int | None,
    ) -> _Open | None:
        group = kwargs.get("group", args[group_at] if group_at is not None and len(args) > group_at else None)
        tensors = None
        if tensor_at is not None:
            tensors = args[tensor_at] if len(args) > tensor_at else kwargs.get(tensor_name or "")
        source = getattr(self._local, "source", None) or "python"
        pending = self._open(op, group, nbytes(tensors), source)
        if source == "python" and not self._in_backward():
            pending.site, pending.via = issuing_site(sys._getframe(2), self._torch_dir)
        return pending

    def _in_backward(self) -> bool:
        """Whether autograd is running a backward on this thread (DDP's and FSDP's hooks, a comm hook); a
        torch without the query counts as inside, so no site is claimed."""
        return self._graph_task is None or self._graph_task() != -1

    def _open(self, op: str, group: Any, size_bytes: int, source: str) -> _Open:
        key, size = self._group(group)
        with self._lock:
            seq = self._seq.get(key, 0)
            self._seq[key] = seq + 1
        marks = self.marks
        issued = marks.mark()
        return _Open(self.step(), op, key, seq, size_bytes, size, issued, marks, source, time.perf_counter())

    def timed(self, op: str, group: Any, size_bytes: int, source: str, call: Callable[[], Any]) -> Any:
        """Run a blocking collective issued from C++ (``call``), timed like the wrapped Python ones."""
        if not self.active or getattr(self._local, "depth", False):
            return call()
        try:
            pending = self._open(op, group, size_bytes, source)
        except Exception as exc:
            self._failed(exc)
            return call()
        self._local.depth = True
        try:
            result = call()
        finally:
            self._local.depth = False
        try:
            self._end(pending, None, False)
        except Exception as exc:
            self._failed(exc)
        return result

    def _end(self, pending: _Open | None, result: Any, asynchronous: bool) -> None:
        if pending is None:
            return
        if len(self.records) >= MAX_RECORDS:
            self.dropped += 1
            return
        self.records.append(pending)
        self._step_count += 1
        self._step_bytes += pending.bytes
        if asynchronous and result is not None:
            future = None
            with contextlib.suppress(Exception):  # some backends' work objects have no future
                future = result.get_future()
            if future is not None:
                future.add_done_callback(lambda _f: self._completed(pending))
            return
        pending.done = pending.clock.mark()
        pending.blocked_s = time.perf_counter() - pending.host_t0
        self._step_blocked += pending.blocked_s

    def _completed(self, pending: _Open) -> None:
        with contextlib.suppress(Exception):  # a callback on the backend's thread must never raise
            pending.done = pending.clock.mark()

    def _failed(self, exc: BaseException) -> None:
        self.active = False
        self.fail(exc)

    # -- DDP --------------------------------------------------------------------------------------
    def _install_ddp(self) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        recorder = self
        original_init = vars(DDP)["__init__"]
        original_builtin = vars(DDP)["_register_builtin_comm_hook"]

        def __init__(module: Any, /, *args: Any, **kwargs: Any) -> None:
            """Positional-only: ``DistributedDataParallel(module=model)`` (Lightning's call) names DDP's own
            ``module`` argument, which must reach the original untouched."""
            original_init(module, *args, **kwargs)
            if recorder.active:
                try:
                    handle: list[Any] = []

                    def first_forward(mod: Any, _inputs: Any) -> None:
                        handle[0].remove()
                        recorder._guarded(recorder._register_ddp_hook, mod)

                    handle.append(module.register_forward_pre_hook(first_forward))
                except Exception as exc:
                    recorder._failed(exc)

        def _register_builtin_comm_hook(module: Any, /, *args: Any, **kwargs: Any) -> Any:
            module._pitstop_builtin_hook = True
            return original_builtin(module, *args, **kwargs)

        original_broadcast = vars(DDP)["_distributed_broadcast_coalesced"]

        def _distributed_broadcast_coalesced(module: Any, tensors: Any, /, *args: Any, **kwargs: Any) -> Any:
            """DDP's buffer broadcast at each forward's start, a C++ collective the ranks wait in."""
            return recorder.timed(
                "broadcast",
                module.process_group,
                nbytes(list(tensors)),
                "ddp",
                lambda: original_broadcast(module, tensors, *args, **kwargs),
            )

        DDP._distributed_broadcast_coalesced = _distributed_broadcast_coalesced  # type: ignore[method-assign,assignment]
        self._restore.append(lambda: setattr(DDP, "_distributed_broadcast_coalesced", original_broadcast))
        DDP.__init__ = __init__  # type: ignore[method-assign,assignment]
        DDP._register_builtin_comm_hook = _register_builtin_comm_hook  # type: ignore[method-assign,assignment]
        self._restore.append(lambda: setattr(DDP, "__init__", original_init))
        self._restore.append(lambda: setattr(DDP, "_register_builtin_comm_hook", original_builtin))

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            self._failed(exc)

    def _register_ddp_hook(self, module: Any) -> None:
        """Route the reducer's default all-reduce through the timed Python all_reduce (unless the user chose
        a hook: theirs goes through the wrappers already, marked as DDP's)."""
        if not self.active or getattr(module, "_pitstop_builtin_hook", False):
            return
        hooks = getattr(module, "_comm_hooks", None)
        if hooks is None or hooks:
            return  # an older DDP we cannot read, or the user's own hook
        if any(getattr(p, "is_sparse", False) for p in module.parameters()):
            return
        if getattr(module, "gradient_as_bucket_view", True):
            # the reducer then divides the bucket in place (div_) from the second step on, which a hook cannot
            # tell from the first step's multiply-while-copying: leave DDP's buckets untimed rather than risk a bit
            return
        module.register_comm_hook(module.process_group, self._ddp_hook())

    def _ddp_hook(self) -> Callable[[Any, Any], Any]:
        import torch.distributed as dist

        local = self._local

        def pitstop_allreduce_hook(process_group, bucket):  # type: ignore[no-untyped-def]
            """The reducer's built-in default, in Python: the bucket holds the raw gradients, which it
            multiplies by 1/world size (exactly as the reducer's copy does) before a sum all-reduce.
            Unannotated on purpose: DDP checks a hook's annotations, which this module's are strings."""
            tensor = bucket.buffer()
            group: Any = process_group if process_group is not None else dist.group.WORLD
            tensor.mul_(1.0 / group.size())
            local.source = "ddp"
            try:
                work = dist.all_reduce(tensor, group=group, async_op=True)
            finally:
                local.source = None
            return work.get_future().then(lambda fut: fut.value()[0])

        return pitstop_allreduce_hook

    # -- per step and at the end ------------------------------------------------------------------
    def close_step(self, record: StepRecord) -> None:
        """Put this step's counts on its record (host-blocked time is host-measured, so exact at once)."""
        record.end_t = time.perf_counter() - self.origin
        if self._seq:  # only once the job has issued a collective
            record.collectives = self._step_count
            record.collective_bytes = self._step_bytes
            record.collective_blocked_s = self._step_blocked
        self._step_count = 0
        self._step_bytes = 0
        self._step_blocked = 0.0

    def resolve(self, first_step: int, last_step: int | None = None) -> list[CollectiveRecord]:
        """The records of steps ``first_step..last_step``, their marks turned into seconds."""
        out: list[CollectiveRecord] = []
        for p in self.records:
            if p.step < first_step or (last_step is not None and p.step > last_step):
                continue
            try:
                issued = p.clock.seconds(p.issued)
                done = None if p.done is None else p.clock.seconds(p.done)
            except Exception:
                continue
            out.append(
                CollectiveRecord(
                    step=p.step,
                    op=p.op,
                    group=p.group,
                    seq=p.seq,
                    bytes=p.bytes,
                    size=p.size,
                    issued_t=issued,
                    done_t=done,
                    blocked_s=p.blocked_s,
                    source=p.source,
                    clock=p.clock.clock,
                    site=p.site,
                    via=p.via,
                )
            )
        return out


def describe(env: Environment) -> None:
    """The backend of the default group, the hosts of the job, and the transport settings a user set."""
    env.comm_env = {k: v for k, v in os.environ.items() if k.startswith(COMM_ENV_PREFIXES)} or None
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            env.dist_backend = str(dist.get_backend())
    gather.prepare()
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if env.world_size and local.isdigit() and int(local) > 0:
        env.nodes = max(1, -(-env.world_size // int(local)))


@collector
class CollectivesCollector(Collector):
    """The counters are ``CollectiveRecorder``'s records and per-step totals."""

    order = 100  # last: its notes follow the probe's own in probe_errors

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.recorder = CollectiveRecorder(ctx.origin, ctx.step_index, ctx.disable)

    def install(self) -> None:
        self.recorder.install()

    def remove(self) -> None:
        self.recorder.remove()

    def begin(self) -> None:
        if self.ctx.environment is not None:
            describe(self.ctx.environment)
        if self.ctx.on_cuda:
            self.recorder.use_device_clock()

    def step_end(self, record: StepRecord) -> None:
        self.recorder.close_step(record)

    def stop_window(self) -> None:
        self.recorder.active = False

    def fill(self, draft: RankProfile) -> None:
        steps = draft.steps
        draft.collectives = self.recorder.resolve(steps[0].index, steps[-1].index) if steps else []
        draft.probe_errors += self.recorder.notes()
