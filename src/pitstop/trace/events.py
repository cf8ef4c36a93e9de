"""Streaming a Kineto trace into compact columns, one pass, without holding the JSON tree.

Events are read in batches (jsonstream: msgspec, else the C JSON decoder, on chunks of decompressed text;
fastevents: the fields read here) and only what the analyses need is kept:
start / end times in flat float arrays per kind (GPU kernels, memcpy, memset, CUDA runtime calls,
DataLoader spans, CPU operators), a few integers (stream, device, correlation id), and counters that can be
taken on the fly (operator names that reveal the attention path, matmul input dtypes). Every later step
works on these columns; a 1 GB trace costs tens of MB, not tens of GB.
"""

from __future__ import annotations

import functools
import math
import os
import re
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pitstop.artifacts import head
from pitstop.trace.jsonstream import event_batches
from pitstop.trace.shapes import SHAPE_ONLY_OPS, ShapeLog

if TYPE_CHECKING:
    from pitstop.trace.fastevents import Args

K = TypeVar("K")
V = TypeVar("V")
STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
# what marks a training step where ProfilerStep#N does not (trace/steps.py): the optimizer's own spans, the
# autograd engine's backward nodes, and the user's repeated record_function annotations
OPTIMIZER_MARK = re.compile(r"^Optimizer\.(step|zero_grad)#")
BACKWARD_NODE = "autograd::engine::evaluate_function"
BACKWARD_OP = re.compile(r"Backward\d*$")
MAX_ANNOTATION_KEYS = (
    256  # distinct annotation names kept with their spans (a trace of unique names: the first)
)
_DIGITS = re.compile(r"\d+")
SYNC_RUNTIME = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "hipStreamSynchronize",
    "hipDeviceSynchronize",
    "hipEventSynchronize",
)
# runtime calls that return only when the GPU has caught up: blocking copies (CUDA's cudaMemcpy, HIP's
# hipMemcpyWithStream, which PyTorch's synchronous copies use on ROCm); cudaMemcpyAsync to pageable memory
# blocks as well, which only its copy's end tells (stats.blocking_copies)
BLOCKING_COPY_RUNTIME = (
    "cudaMemcpy",
    "cudaMemcpy2D",
    "cudaMemcpy3D",
    "hipMemcpy",
    "hipMemcpy2D",
    "hipMemcpyWithStream",
)
# the device allocator's own calls (the caching allocator turned off, or flushed and refilled): each
# synchronises the device; the stream-ordered ones (cudaMallocAsync, hipFreeAsync) do not and are not here
ALLOC_RUNTIME = re.compile(
    r"^(?:cudaMalloc|cudaFree|hipMalloc|hipFree|cuMemAlloc|cuMemFree|cudaHostAlloc|cudaMallocHost|cudaFreeHost"
    r"|hipHostMalloc|hipHostFree|hipExtMallocWithFlags)(?!Async)"
)
SYNC_OPS = (
    "aten::_local_scalar_dense",
)  # what .item() / .tolist() / bool(tensor) run; it copies to the host
LAUNCH_NAMES = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "hipLaunchKernel",
    "hipExtLaunchKernel",
    "hipModuleLaunchKernel",
    "hipExtModuleLaunchKernel",
    "cudaLaunchCooperativeKernel",
)
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")
ATTENTION_OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_flash_attention_forward": "flash",
    "aten::_scaled_dot_product_efficient_attention": "mem_efficient",
    "aten::_efficient_attention_forward": "mem_efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash_cpu",
}
MEMCPY_CATS = ("gpu_memcpy", "memcpy")
MEMSET_CATS = ("gpu_memset", "memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "runtime")
CPU_OP_CATS = ("cpu_op", "operator", "python")
COMM_OP_NAMES = frozenset(
    f"{lib}:{op}"
    for lib in ("nccl", "gloo")
    for op in ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter")
)


def _floats() -> array:
    return array("d")


def _ints() -> array:
    return array("q")


def _flags() -> array:
    return array("b")  # small codes and 0/1 flags: one byte each (a 2 GB trace has millions of rows)


@dataclass
class Columns:
    ts: array = field(default_factory=_floats)
    end: array = field(default_factory=_floats)

    def add(self, ts: float, dur: float) -> None:
        self.ts.append(ts)
        self.end.append(ts + dur)

    def __len__(self) -> int:
        return len(self.ts)


@dataclass
class MergedColumns(Columns):
    """Intervals used only through their union (CPU operators and annotations): an event that overlaps the
    last kept interval widens it to their hull instead of being stored. The union is the same; nested
    operators of one thread, which arrive next to each other, collapse, so memory does not follow the
    operator count."""

    def add(self, ts: float, dur: float) -> None:
        end = ts + dur
        if self.ts and ts <= self.end[-1] and end >= self.ts[-1]:  # overlaps the last: keep the hull
            if end > self.end[-1]:
                self.end[-1] = end
            if ts < self.ts[-1]:
                self.ts[-1] = ts
            return
        self.ts.append(ts)
        self.end.append(end)


@dataclass
class GpuColumns(Columns):
    stream: array = field(default_factory=_ints)
    device: array = field(default_factory=_ints)
    correlation: array = field(default_factory=_ints)
    external: array = field(default_factory=_ints)
    code: array = field(default_factory=_flags)  # kernel class / memcpy kind code, see the constants below


@dataclass
class RuntimeColumns(Columns):
    correlation: array = field(default_factory=_ints)
    sync: array = field(default_factory=_flags)  # 1 for blocking synchronizations and copies
    api: array = field(
        default_factory=_flags
    )  # the call's name: TraceColumns.runtime_names[api - 1] (0: past them)
    driver: array = field(
        default_factory=_flags
    )  # 1 for cuda_driver events (the TensorBoard plugin ignores them)


@dataclass
class CollectiveColumns(Columns):
    """NCCL / RCCL kernels on the GPU: what the cross-rank step matches between ranks."""

    kind: array = field(default_factory=_ints)  # index into COLLECTIVE_KINDS
    nbytes: array = field(default_factory=_floats)  # message size (the larger of in / out), -1 unknown
    group: array = field(default_factory=_ints)  # index into TraceColumns.comm_groups
    group_size: array = field(default_factory=_ints)  # ranks in the communicator, -1 unknown


# kernel classes, as Holistic Trace Analysis names them (hta/utils/utils.py get_kernel_type)
COMPUTE, COMMUNICATION, MEMORY_KERNEL, OTHER_KERNEL = 0, 1, 2, 3
# memcpy kinds
H2D_PAGEABLE, H2D_PINNED, D2H, D2D, OTHER_COPY = 0, 1, 2, 3, 4


@dataclass
class TraceColumns:
    path: Path
    rank: int | None = None
    world_size: int | None = None
    device_names: dict[int, str] = field(default_factory=dict)
    steps: list[tuple[int, float, float]] = field(default_factory=list)  # (N, start, end) of ProfilerStep#N
    kernels: GpuColumns = field(default_factory=GpuColumns)
    memcpy: GpuColumns = field(default_factory=GpuColumns)
    memset: GpuColumns = field(default_factory=GpuColumns)
    runtime: RuntimeColumns = field(default_factory=RuntimeColumns)
    dataloader: Columns = field(default_factory=Columns)
    dataloader_names: Counter[str] = field(default_factory=Counter)
    cpu_ops: MergedColumns = field(default_factory=MergedColumns)  # cpu_op / operator / python ("CPU Exec")
    annotations: MergedColumns = field(default_factory=MergedColumns)  # user annotations but steps and NCCL
    comm_ops: Columns = field(default_factory=Columns)  # CPU-side nccl:* / gloo:* operators
    comm_externals: set[int] = field(default_factory=set)  # their external ids: kernels launched under them
    collectives: CollectiveColumns = field(default_factory=CollectiveColumns)
    comm_groups: list[str] = field(default_factory=list)  # process group names, in order of appearance
    gpu_other: GpuColumns = field(default_factory=GpuColumns)  # other events on a GPU stream (cuda_sync, ...)
    sync_ops: Columns = field(default_factory=Columns)
    memcpy_bytes: array = field(default_factory=_floats)
    matmul_dtypes: Counter[str] = field(default_factory=Counter)
    shapes: ShapeLog = field(default_factory=ShapeLog)  # matmuls', embeddings', convolutions' input shapes
    attention_ops: Counter[str] = field(default_factory=Counter)
    softmax_ops: int = 0
    bmm_ops: int = 0
    matmul_ops: int = 0  # matrix multiplications the host dispatched (with or without recorded types)
    gemm_fp32_us: float = 0.0
    gemm_tf32_us: float = 0.0
    gemm_low_us: float = 0.0
    gemm_us: float = 0.0
    events: int = 0
    bad_events: int = 0
    negative_durations: int = 0
    categories: Counter[str] = field(default_factory=Counter)
    vendor: str | None = None
    # runtime call names, in order of appearance (RuntimeColumns.api indexes this); the first MAX_RUNTIME_NAMES
    runtime_names: list[str] = field(default_factory=list)
    runtime_codes: dict[str, int] = field(default_factory=dict)
    # step markers besides ProfilerStep#N (trace/steps.py): Optimizer.step / .zero_grad spans, backward nodes,
    # user annotations by name (digits folded: "step_3" and "step_4" are one name)
    optimizer_steps: Columns = field(default_factory=Columns)
    zero_grads: Columns = field(default_factory=Columns)
    backward: MergedColumns = field(default_factory=MergedColumns)
    backward_ops: int = 0
    annotated: dict[str, Columns] = field(default_factory=dict)


MAX_RUNTIME_NAMES = 126  # RuntimeColumns.api is one signed byte; 0 is "another name"


# every NCCL / RCCL generation: ncclAllReduceRingLLKernel_sum_f32 (NCCL < 2.8), ncclKernel_AllReduce_RING_LL_Sum_float
# (2.8-2.18, and RCCL), ncclDevKernel_AllReduce_Sum_f32_RING_LL (>= 2.19), RCCL's ncclDevKernel_Generic_4 and
# MSCCL's mscclKernel_Sum_f32_LL; a demangled name may start with "void "
_COMM_KERNEL = re.compile(r"^(?:void\s+)?(?:nccl|rccl|msccl)\w*?kernel", re.I)
COLLECTIVE_KINDS = (
    "allreduce",
    "allgather",
    "reducescatter",
    "alltoall",
    "broadcast",
    "reduce",
    "sendrecv",
    "send",
    "recv",
    "other",
)
_KIND_IN_NAME = re.compile(
    r"all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|send_?recv|send|recv|reduce", re.I
)
_DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "bfloat16": 2,
    "half": 2,
    "float16": 2,
    "double": 8,
    "float64": 8,
    "long": 8,
    "int64": 8,
    "int": 4,
    "int32": 4,
    "byte": 1,
    "char": 1,
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


def collective_kind(name: str, collective_arg: object = None) -> int:
    """Index into COLLECTIVE_KINDS from the kernel name, or the "Collective name" argument newer traces
    carry (RCCL's generic kernel names say nothing)."""
    for text in (name, collective_arg if isinstance(collective_arg, str) else ""):
        m = _KIND_IN_NAME.search(text)
        if m:
            return COLLECTIVE_KINDS.index(m.group(0).lower().replace("_", ""))
    return len(COLLECTIVE_KINDS) - 1


_MEMORY_KERNEL = re.compile(r"^(Memcpy|Memset|dma)")


def _kernel_class(name: str) -> int:
    """Communication (NCCL/RCCL kernels), memory, compute; names mentioning Memcpy or Sync are 'other'."""
    if _COMM_KERNEL.match(name):
        return COMMUNICATION
    if _MEMORY_KERNEL.match(name):
        return MEMORY_KERNEL
    if "Memcpy" in name or "Sync" in name:
        return OTHER_KERNEL
    return COMPUTE


def _copy_kind(name: str) -> int:
    if "HtoD" in name or "HostToDevice" in name:
        return H2D_PAGEABLE if "Pageable" in name else H2D_PINNED
    if "DtoH" in name or "DeviceToHost" in name:
        return D2H
    if "DtoD" in name or "DeviceToDevice" in name:
        return D2D
    return OTHER_COPY


# GEMM kernels (cuBLAS, CUTLASS, rocBLAS/Tensile "Cijk_...") by the precision they run in:
# bf16/fp16 tensor cores, TF32 tensor cores ("tf32", Ampere's "s1688gemm"), or plain fp32 (SIMT "sgemm",
# Tensile's single-precision "_SB_" / "_S_" type code)
GEMM = re.compile(r"(?<!fb)gemm|gemv|matmul|cutlass|cublas|wgmma|xmma|^Cijk_", re.I)  # not fbgemm's permutes
LOW_PRECISION_GEMM = re.compile(r"bf16|fp16|f16|h1688|h16816|h884|hmma|_HB_|_BB|_HH", re.I)
TF32_GEMM = re.compile(r"tf32|s1688gemm|tensorop_s1688|s16816gemm", re.I)
FP32_GEMM = re.compile(
    r"(^|_)sgemm|_f32f32_f32|gemv2T_kernel_val<int, int, float|^Cijk_[A-Za-z]+_[A-Za-z]+_S[B_]", re.I
)


def _head_metadata(path: Path, columns: TraceColumns) -> None:
    """Rank and device names, from the small objects Kineto writes before the event list."""
    import json

    text = head(path, 1 << 20).decode("utf-8", errors="replace")
    m = re.search(r'"distributedInfo"\s*:\s*(?=\{)', text)
    if m:
        try:  # newer traces nest the process groups ("pg_config": [{...}]) inside it
            info, _ = json.JSONDecoder().raw_decode(text, m.end())
            columns.rank = int(info["rank"]) if "rank" in info else None
            columns.world_size = int(info["world_size"]) if "world_size" in info else None
        except (ValueError, TypeError, KeyError, RecursionError):
            pass
    for dev in re.finditer(r'"id"\s*:\s*(\d+)\s*,\s*"name"\s*:\s*"([^"]*)"', text):
        columns.device_names[int(dev.group(1))] = dev.group(2)


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # what the id columns (array "q") hold
_IDS = range(INT64_MIN, INT64_MAX + 1)


def _int(value: Any, default: int = -1) -> int:
    """An id or count as the columns hold it; anything else (a string, infinity, a number past 64 bits) is
    unknown."""
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return number if INT64_MIN <= number <= INT64_MAX else default


def _add_gpu(cols: GpuColumns, ts: float, dur: float, args: Args, code: int) -> None:
    """One event on a GPU stream; ids that already are 64-bit ints (nearly all) skip ``_int``'s call."""
    cols.add(ts, dur)
    v = args.stream
    cols.stream.append(v if type(v) is int and v in _IDS else _int(v))
    v = args.device
    cols.device.append(v if type(v) is int and v in _IDS else _int(v))
    v = args.correlation
    cols.correlation.append(v if type(v) is int and v in _IDS else _int(v))
    v = args.external_id()
    cols.external.append(v if type(v) is int and v in _IDS else _int(v))
    cols.code.append(code)


# what a CPU-side operator name means to the analyses (most names mean nothing and cost one dict miss)
_OP_SYNC, _OP_ATTENTION, _OP_MATMUL, _OP_SOFTMAX, _OP_BMM, _OP_SHAPE = range(6)
_OP_ROLES: dict[str, int] = {name: _OP_SYNC for name in SYNC_OPS}
_OP_ROLES.update({name: _OP_ATTENTION for name in ATTENTION_OPS})
_OP_ROLES.update({name: _OP_MATMUL for name in MATMUL_OPS})
_OP_ROLES.update({"aten::softmax": _OP_SOFTMAX, "aten::_softmax": _OP_SOFTMAX})
_OP_ROLES.update({"aten::bmm": _OP_BMM, "aten::baddbmm": _OP_BMM})
_OP_ROLES.update({name: _OP_SHAPE for name in SHAPE_ONLY_OPS})
_GEMM_KINDS = ("low", "tf32", "fp32", "other")


def _kernel_info(name: str) -> tuple[int, str | None]:
    """(kernel class, GEMM precision or None), computed once per distinct kernel name."""
    gemm = None
    if GEMM.search(name):
        if LOW_PRECISION_GEMM.search(name):
            gemm = "low"
        elif TF32_GEMM.search(name):
            gemm = "tf32"
        elif FP32_GEMM.search(name):
            gemm = "fp32"
        else:
            gemm = "other"
    return _kernel_class(name), gemm


# what an event's category makes of it (decided once per distinct category, in the order of the checks)
_KERNEL, _MEMCPY, _MEMSET, _RUNTIME, _CPU, _STREAM_OTHER, _IGNORED = range(7)


def _role_of(cat: str) -> int:
    if cat == "kernel":
        return _KERNEL
    if cat in MEMCPY_CATS:
        return _MEMCPY
    if cat in MEMSET_CATS:
        return _MEMSET
    if cat in RUNTIME_CATS:
        return _RUNTIME
    if cat.startswith("gpu_"):
        return _IGNORED  # GPU-side copies of CPU annotations (gpu_user_annotation): the CPU ones count
    if cat in CPU_OP_CATS or cat == "user_annotation":
        return _CPU
    if cat == "python_function":
        return _IGNORED
    return _STREAM_OTHER  # kept when on a GPU stream, e.g. cuda_sync "Stream Wait Event"


class _Memo(dict[K, V]):
    """A cache filled on a miss by ``make``: in the event loop a hit is one subscript, with no test for
    None and no method call."""

    def __init__(self, make: Callable[[K], V]) -> None:
        super().__init__()
        self.make = make

    def __missing__(self, key: K) -> V:
        if len(self) >= _MEMO_LIMIT:  # a trace of millions of distinct names: bounded memory, same answers
            self.clear()
        value = self[key] = self.make(key)
        return value


_MEMO_LIMIT = 1 << 16


def _runtime_flags(cols: TraceColumns, name: str) -> tuple[int, int]:
    """(blocking synchronization or copy, name code) for a runtime call's name, as the columns hold them."""
    code = cols.runtime_codes.get(name)
    if code is None:
        code = len(cols.runtime_names) + 1 if len(cols.runtime_names) < MAX_RUNTIME_NAMES else 0
        if code:
            cols.runtime_names.append(name)
            cols.runtime_codes[name] = code
    return (1 if name in SYNC_RUNTIME or name in BLOCKING_COPY_RUNTIME else 0), code


def _plain_name(name: str) -> bool:
    """True for an operator name that _cpu_event only adds to the CPU intervals (no step, DataLoader,
    collective or operator role)."""
    if name.startswith("ProfilerStep#") and STEP_NAME.match(name):
        return False
    if name.startswith(("enumerate(DataLoader)", "enumerate(DataPipe)#", "Optimizer.", BACKWARD_NODE)):
        return False
    if BACKWARD_OP.search(name):
        return False
    return name not in COMM_OP_NAMES and name not in _OP_ROLES


def _category(raw: object) -> tuple[str, int]:
    """An event's category, lower-cased, and what it makes of the event."""
    lowered = str(raw).lower()
    return lowered, _role_of(lowered)


def read_columns(path: Path, c_loop: bool = True, from_text: bool = True) -> TraceColumns:
    """One streaming pass over a Kineto trace (the loop itself: ``_EventLoop.take``; ``c_loop=False``
    reads every event with the Python loop, which the C one is tested against; ``from_text=False`` has the
    C loop take msgspec's structs only, which its reader of text is tested against)."""
    from msgspec import Struct

    from pitstop.trace.fastevents import as_event

    cols = TraceColumns(path=path)
    _head_metadata(path, cols)
    loop = _EventLoop(cols, fast=c_loop, from_text=from_text)
    for batch in event_batches(path, loop.text):
        loop.n_events += len(batch)
        if batch and not isinstance(batch[0], Struct):  # the exact path's plain JSON values
            batch = [ev for ev in map(as_event, batch) if ev is not None]
        loop.take(batch)
    return loop.finish()


class _EventLoop:
    """The hot path of ``pitstop analyze`` after JSON decoding. Per-name and per-category facts are
    cached, the columns' append methods are bound once, and the work per event is inline: ``_take`` copies
    what it uses into locals for a batch and stores the running state back at its end.

    Where the C loop (``_eventloop.c``, the same loop event for event) is built, it takes each batch;
    an event it leaves to Python (a time that is an int past 2**52, say) hands the rest of the trace to
    ``_take``, with the running state."""

    def __init__(self, cols: TraceColumns, fast: bool = True, from_text: bool = True) -> None:
        self.cols = cols
        runtime = cols.runtime
        columns = (runtime.ts, runtime.end, runtime.correlation, runtime.sync, runtime.api, runtime.driver)
        self.runtime_appends = tuple(a.append for a in columns)
        self.runtime_flags = _Memo(functools.partial(_runtime_flags, cols))
        self.kernel_cache, self.plain_names, self.cat_cache = (
            _Memo(_kernel_info),
            _Memo(_plain_name),
            _Memo(_category),
        )
        self.gemm_time = dict.fromkeys(_GEMM_KINDS, 0.0)
        self.categories: dict[str, int] = {}
        self.vendor: str | None = None
        self.n_events = self.bad = self.negative = 0
        # the CPU operators' union as it grows (MergedColumns.add, inline): the last interval stays in
        # locals until one that does not overlap it arrives; half of a trace's events are CPU operators
        self.open_ts, self.open_end = math.inf, -math.inf  # none yet
        self.fast = _c_loop(self) if fast and os.environ.get("PITSTOP_TRACE_LOOP") != "python" else None
        self.from_text = from_text

    def text(self, chunk: memoryview) -> list[Any] | None:
        """A chunk of whole events (``[...]`` text), as jsonstream's ``fast`` decoder: the C loop takes its
        events straight from the text where it can (an empty batch comes back, the events are counted here);
        else msgspec's structs (None: the stdlib's values), which ``take`` then takes."""
        from pitstop.trace.fastevents import decode

        if self.fast is None or not self.from_text:
            return decode(chunk)
        done = self.fast.take_text(chunk)
        if done is None:  # something the C reader does not hold as msgspec would: msgspec's
            return decode(chunk)
        items, taken = done
        self.n_events += taken
        if taken == items:
            return []
        # an event left to Python: it and the rest of the chunk go to the Python loop, with the C loop's state
        self._leave_c_loop()
        batch = decode(chunk)
        if batch is None:  # not expected (the C reader took the chunk for valid): the stdlib's values
            import json

            batch = json.loads(str(chunk, "utf-8"))
        return batch[taken:]

    def take(self, batch: list[Any]) -> None:
        fast = self.fast
        if fast is not None:
            done = fast.take(batch)
            if done == len(batch):
                return
            self._leave_c_loop()
            batch = batch[done:]
        self._take(batch)

    def _leave_c_loop(self) -> None:
        """The C loop's running state, taken over by the Python loop."""
        assert self.fast is not None
        self.open_ts, self.open_end, self.vendor, bad, negative, gemm = self.fast.state()
        self.bad += bad
        self.negative += negative
        self.gemm_time = dict(zip(_GEMM_KINDS, gemm, strict=True))
        self.fast = None

    def _take(self, batch: list[Any]) -> None:
        from pitstop.trace.fastevents import BAD, NO_ARGS, Event

        cols, categories, cat_cache, plain_names = (
            self.cols,
            self.categories,
            self.cat_cache,
            self.plain_names,
        )
        rt_ts, rt_end, rt_corr, rt_sync, rt_api, rt_driver = self.runtime_appends
        runtime_flags, cpu_ts, cpu_end = self.runtime_flags, cols.cpu_ops.ts, cols.cpu_ops.end
        open_ts, open_end, vendor, bad, negative = self.open_ts, self.open_end, self.vendor, 0, 0
        for ev in batch:
            if type(ev) is not Event:  # another phase, or a complete event without a numeric time
                if ev is BAD:
                    bad += 1
                continue
            ts, dur = ev.ts, ev.dur  # numbers: fastevents made any other event BAD
            if dur < 0:
                negative += 1
                continue
            if not (-1e18 < ts < 1e18 and dur < 1e15):  # 1e400 parses as inf; NaN fails every comparison
                bad += 1
                continue
            raw_cat = ev.cat
            if type(raw_cat) is not str:  # a list or object would not hash: count it as a malformed event
                bad += 1
                continue
            cat, role = cat_cache[raw_cat]
            categories[cat] = categories.get(cat, 0) + 1
            if role == _IGNORED:
                continue
            name = ev.name
            if type(name) is not str:
                name = str(name)
            args = ev.args or NO_ARGS  # a struct is always true
            if role == _CPU:
                if (plain_names[name] and cat != "user_annotation") or _cpu_event(
                    cols, cat, name, ts, dur, args
                ):
                    end = ts + dur
                    if ts <= open_end and end >= open_ts:  # overlaps the open interval: keep the hull
                        if end > open_end:
                            open_end = end
                        if ts < open_ts:
                            open_ts = ts
                    else:
                        if open_ts <= open_end:
                            cpu_ts.append(open_ts)
                            cpu_end.append(open_end)
                        open_ts, open_end = ts, end
            elif role == _RUNTIME:
                rt_ts(ts)
                rt_end(ts + dur)
                corr = args.correlation
                rt_corr(corr if type(corr) is int and corr in _IDS else _int(corr))
                sync, api = runtime_flags[name]
                rt_sync(sync)
                rt_api(api)
                rt_driver(1 if cat == "cuda_driver" else 0)
                if vendor is None:
                    vendor = "amd" if name.startswith("hip") else "nvidia" if name.startswith("cu") else None
            elif role == _KERNEL:
                self.kernel(name, ts, dur, args)
            else:
                _other_gpu_event(cols, role, name, ts, dur, args)
        self.open_ts, self.open_end, self.vendor = open_ts, open_end, vendor
        self.bad += bad
        self.negative += negative

    def kernel(self, name: str, ts: float, dur: float, args: Args) -> None:
        """A kernel's columns, its GEMM time and, for NCCL / RCCL kernels, the collective."""
        info = self.kernel_cache[name]
        _add_gpu(self.cols.kernels, ts, dur, args, info[0])
        if info[1] is not None:
            self.gemm_time[info[1]] += dur
        if info[0] == COMMUNICATION:
            _add_collective(self.cols, name, ts, dur, args)

    def finish(self) -> TraceColumns:
        if self.fast is not None:
            self._leave_c_loop()
        if self.open_ts <= self.open_end:
            self.cols.cpu_ops.ts.append(self.open_ts)
            self.cols.cpu_ops.end.append(self.open_end)
        self.cols.vendor = self.vendor
        return _totals(self.cols, self.n_events, self.bad, self.negative, self.categories, self.gemm_time)


def _c_loop(loop: _EventLoop) -> Any:
    """The C event loop over ``loop``'s columns, memos and state; None where it is not built (or where
    ``PITSTOP_TRACE_LOOP=python`` asks for the Python loop: the benchmark's baseline)."""
    try:
        from pitstop.trace._eventloop import Loop
    except ImportError:  # installed without a C compiler: the Python loop reads every event
        return None
    from pitstop.trace.fastevents import BAD, MISSING, NO_ARGS, Args, Event, decode_one

    cols, runtime, kernels = loop.cols, loop.cols.runtime, loop.cols.kernels
    try:
        return Loop(
            event_type=Event,
            args_type=Args,
            bad_event=BAD,
            no_args=NO_ARGS,
            missing=MISSING,
            memos=(loop.cat_cache, loop.plain_names, loop.runtime_flags, loop.kernel_cache),
            calls=(
                functools.partial(_cpu_event, cols),
                functools.partial(_add_collective, cols),
                functools.partial(_other_gpu_event, cols),
                _int,
            ),
            categories=loop.categories,
            gemm_kinds=_GEMM_KINDS,
            columns=(
                *(runtime.ts, runtime.end, runtime.correlation, runtime.sync, runtime.api, runtime.driver),
                *(kernels.ts, kernels.end, kernels.stream, kernels.device, kernels.correlation),
                *(kernels.external, kernels.code, cols.cpu_ops.ts, cols.cpu_ops.end),
            ),
            roles=(_KERNEL, _MEMCPY, _MEMSET, _RUNTIME, _CPU, _STREAM_OTHER, _IGNORED),
            one=decode_one,
        )
    except (TypeError, ValueError):  # a msgspec whose structs hold their fields otherwise: the Python loop
        return None


def _other_gpu_event(cols: TraceColumns, role: int, name: str, ts: float, dur: float, args: Args) -> None:
    """Memcpy, memset, and other events on a GPU stream (rarer than kernels: out of the loop)."""
    from pitstop.trace.fastevents import MISSING

    if role == _MEMCPY:
        _add_gpu(cols.memcpy, ts, dur, args, _copy_kind(name))
        size = args.nbytes
        cols.memcpy_bytes.append(float(size) if isinstance(size, int | float) else 0.0)
    elif role == _MEMSET:
        _add_gpu(cols.memset, ts, dur, args, 0)
    elif args.stream is not MISSING:
        _add_gpu(cols.gpu_other, ts, dur, args, 0)


def _totals(
    cols: TraceColumns,
    n_events: int,
    bad: int,
    negative: int,
    categories: dict[str, int],
    gemm_time: dict[str, float],
) -> TraceColumns:
    """The counters the loop kept in locals (cheaper there than attributes), stored on the columns."""
    cols.events = n_events
    cols.bad_events, cols.negative_durations = bad, negative
    cols.categories.update(categories)
    cols.gemm_us = sum(gemm_time.values())
    cols.gemm_low_us, cols.gemm_tf32_us, cols.gemm_fp32_us = (
        gemm_time["low"],
        gemm_time["tf32"],
        gemm_time["fp32"],
    )
    return cols


def _add_collective(cols: TraceColumns, name: str, ts: float, dur: float, args: Args) -> None:
    c = cols.collectives
    c.add(ts, dur)
    c.kind.append(collective_kind(name, args.collective))
    elems = [v for v in (args.in_nelems, args.out_nelems) if type(v) is int and v >= 0]
    size = _DTYPE_BYTES.get(str(args.dtype).lower().removeprefix("c10::"), 0)
    c.nbytes.append(float(max(elems) * size) if elems and size else -1.0)
    group = str(args.group)
    if group not in cols.comm_groups:
        cols.comm_groups.append(group)
    c.group.append(cols.comm_groups.index(group))
    c.group_size.append(_int(args.group_size))


def _cpu_event(cols: TraceColumns, cat: str, name: str, ts: float, dur: float, args: Args) -> bool:
    """Keep what a CPU-side event says; True when it is an operator that the caller adds to the CPU
    operators' union (the event loop holds that union's last interval)."""
    if name.startswith("ProfilerStep#"):
        step = STEP_NAME.match(name)
        if step:
            cols.steps.append((int(step.group(1)), ts, ts + dur))
            return False
    if name.startswith(("Optimizer.", BACKWARD_NODE)) or BACKWARD_OP.search(name):
        _step_marker(cols, cat, name, ts, dur)
        if cat == "user_annotation":
            cols.annotations.add(ts, dur)
            return False
        return True
    if name.startswith(("enumerate(DataLoader)", "enumerate(DataPipe)#")):
        cols.dataloader_names[name] += 1
        if name.endswith(".__next__") or name.startswith("enumerate(DataPipe)#"):
            cols.dataloader.add(ts, dur)  # the batch fetch itself (iterator creation is not a wait)
        return False
    if name in COMM_OP_NAMES:
        cols.comm_ops.add(ts, dur)
        external = _int(args.external_id())
        if external >= 0:
            cols.comm_externals.add(external)
        return False
    if cat == "user_annotation":
        cols.annotations.add(ts, dur)
        _annotation(cols, name, ts, dur)
        return False
    role = _OP_ROLES.get(name)
    if role is None:
        return True
    if role >= _OP_MATMUL and role != _OP_SOFTMAX:
        cols.shapes.add(name, ts, args.input_shapes(), args.input_types())
    if role == _OP_SYNC:
        cols.sync_ops.add(ts, dur)
    elif role == _OP_ATTENTION:
        cols.attention_ops[ATTENTION_OPS[name]] += 1
    elif role == _OP_MATMUL:
        cols.matmul_ops += 1
        types = args.input_types()
        if isinstance(types, list) and types:
            cols.matmul_dtypes[str(types[0])] += 1
    elif role == _OP_SOFTMAX:
        cols.softmax_ops += 1
    elif role == _OP_BMM:
        cols.bmm_ops += 1
    return True


def _step_marker(cols: TraceColumns, cat: str, name: str, ts: float, dur: float) -> None:
    """An optimizer span or a backward node: what steps are found by where ProfilerStep#N is missing."""
    mark = OPTIMIZER_MARK.match(name)
    if mark:
        (cols.optimizer_steps if mark.group(1) == "step" else cols.zero_grads).add(ts, dur)
    elif name.startswith(BACKWARD_NODE):
        cols.backward.add(ts, dur)
        cols.backward_ops += 1
    elif BACKWARD_OP.search(name):
        cols.backward_ops += 1


_NOT_STEP_ANNOTATIONS = ("nccl:", "gloo:", "c10d::", "record_param_comms")


def _annotation(cols: TraceColumns, name: str, ts: float, dur: float) -> None:
    """A user annotation's span under its name with digits folded ("step_3", "step_4": one name)."""
    if not name or name.startswith(_NOT_STEP_ANNOTATIONS):
        return
    key = _DIGITS.sub("N", name)
    spans = cols.annotated.get(key)
    if spans is None:
        if len(cols.annotated) >= MAX_ANNOTATION_KEYS:
            return
        spans = cols.annotated[key] = Columns()
    spans.add(ts, dur)
