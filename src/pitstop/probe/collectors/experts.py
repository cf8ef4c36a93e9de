"""Mixture-of-experts layers: which experts implementation runs, whether it takes the experts one after another,
and the experts' share of the measured steps.

Transformers (>= 5) dispatches every expert module of a supported model (``@use_experts_implementation``:
Mixtral, Qwen2/3-MoE, DeepSeek-V3, OLMoE, GPT-OSS, ...) on ``config._experts_implementation`` at each forward:
``"grouped_mm"`` (its default where the class supports it: two grouped GEMMs over all experts), ``"batched_mm"``
(``bmm`` over gathered weights, meant for decoding), or ``"eager"`` (the class's own loop: one small GEMM pair
per expert hit, with a gather and a scatter each). ``"grouped_mm"`` itself falls back to a per-expert loop where
torch has no kernel for it (torch <= 2.8 on a CPU, a GPU below compute capability 8.0, torch.compile with
non-bf16 weights). Older Transformers, remote code and hand-written models hold the experts in an
``nn.ModuleList`` that the block's forward loops over ("loop").

In the measured steps each expert module is timed with forward hooks registered at the window's start and
removed at its end (no cost outside it): host time on a CPU, CUDA events on a GPU, read once the window ended.
Its backward is timed from its output's gradient to its input's (tensor hooks on the two), so the experts'
share of the step is measured, not taken from a ratio. Under activation checkpointing a forward run again in
the backward is not counted again (its time falls inside the backward's interval).

When the window ends and the job ends next (``closing``), one expert module of a Transformers model that loops
is timed at the job's tokens per call: its own loop against the ``grouped_mm`` function, forward and backward,
on inputs of a private generator (the job's random state and gradients untouched), so the speed-up of
switching is measured on the job's device.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from pitstop.core.profile import ExpertsInfo, RankProfile
from pitstop.probe.collectors.base import Collector, ProbeContext, collector
from pitstop.probe.timing import PairTiming, time_pair

LOOPING = ("eager", "loop")  # implementations that run the experts one after another
MAX_PAIRS = 50_000  # timed forward (and backward) intervals kept in a window; further calls are only counted
MAX_TIMED_TOKENS = 4096  # tokens of one call timed at once after the window (the time is scaled to the job's)
WARMUP = 1  # passes of each implementation before timing
MAX_SECONDS = 3.0  # the interleaved pairs after the window stop past this (at least three), stable or not


def hf_experts(module: Any) -> bool:
    """A Transformers expert module dispatched by ``@use_experts_implementation`` (its ``__init__`` sets these)."""
    return (
        isinstance(getattr(module, "num_experts", None), int)
        and hasattr(module, "_is_expert_parallel")
        and hasattr(module, "has_gate")
        and hasattr(getattr(module, "config", None), "_experts_implementation")
    )


def looped_experts(module: Any) -> bool:
    """A block that holds its experts as an ``nn.ModuleList`` (``self.experts``) and loops over them."""
    import torch

    experts = getattr(module, "experts", None)
    return isinstance(experts, torch.nn.ModuleList) and len(experts) > 1


def expert_modules(model: Any) -> list[tuple[str, Any, bool]]:
    """(name, module, dispatched by Transformers) for each expert layer of the model, in order."""
    found: list[tuple[str, Any, bool]] = []
    named = getattr(model, "named_modules", None)
    if not callable(named):
        return found
    for name, module in named():
        if hf_experts(module):
            found.append((name, module, True))
        elif looped_experts(module):
            found.append((name, module, False))
    return found


def library_of(block: Any) -> str | None:
    """Whose loop it is: "transformers" (its own classes, before v5), "remote code" (a Hub model's
    ``trust_remote_code`` module), else None (the job's own)."""
    module = type(block).__module__
    if module.startswith("transformers_modules"):
        return "remote code"
    return "transformers" if module.startswith("transformers.") else None


def grouped_fallback(module: Any, compiled: bool) -> str | None:
    """Why Transformers' ``grouped_mm`` would run its per-expert loop for this module here (None: the kernel)."""
    import torch

    weight = getattr(module, "gate_up_proj", None)
    if weight is None:
        weight = getattr(module, "up_proj", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 3:
        return None
    if compiled and weight.dtype != torch.bfloat16:
        return f"under torch.compile grouped_mm needs bfloat16 weights (these are {weight.dtype})"
    try:
        from transformers.integrations import moe
    except ImportError:
        return None
    can_use = getattr(moe, "_can_use_grouped_mm", None)
    if not callable(can_use):
        return None
    probe_in = torch.zeros(2, weight.shape[-1], device=weight.device, dtype=weight.dtype)
    offs = torch.zeros(weight.shape[0], device=weight.device, dtype=torch.int32)
    if can_use(probe_in, weight, offs):
        return None
    version = torch.__version__.split("+")[0]
    if weight.device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(weight.device)
        if (major, minor) < (8, 0):
            return f"this GPU's compute capability {major}.{minor} is below 8.0 (grouped_mm needs Ampere or newer)"
        return f"torch {version} has no grouped_mm kernel for this GPU"
    if weight.device.type == "cpu":
        numbers = tuple(int(n) for n in version.split(".")[:2] if n.isdigit())
        if numbers <= (2, 8):
            return f"torch {version} has no CPU grouped_mm kernel (it came in 2.9)"
        return f"torch {version}'s CPU grouped_mm needs 16-byte aligned weights (these are memory-mapped)"
    return f"torch {version} has no grouped_mm kernel on {weight.device.type}"


def available_implementations() -> list[str]:
    """The experts implementations Transformers can dispatch to ("eager" first)."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError:
        return []
    return ["eager", *sorted(ALL_EXPERTS_FUNCTIONS.keys())]


def time_experts(module: Any, tokens: int, top_k: int, hidden: int) -> tuple[PairTiming, int, str]:
    """The loop (first) against grouped (second): one expert module's forward and backward at ``tokens``
    tokens, timed in interleaved pairs until their ratio is stable (``probe/timing.py``), seconds scaled to
    ``tokens``; the tokens timed at once and the dtype. The class's own loop (Transformers' "eager") against
    the ``grouped_mm`` function, on random routing of a private generator. Gradients are returned, never
    accumulated into the job's ``.grad``. Raises what torch raises (out of memory, no kernel)."""
    import torch
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    loop = type(module).forward.__wrapped__  # the class's own forward, under Transformers' dispatch
    grouped = ALL_EXPERTS_FUNCTIONS["grouped_mm"]
    weight = next(module.parameters())
    device, dtype = weight.device, weight.dtype
    timed = max(1, min(tokens, MAX_TIMED_TOKENS))
    generator = torch.Generator(device=device).manual_seed(0)
    states = torch.randn(timed, hidden, generator=generator, device=device, dtype=dtype).requires_grad_(True)
    logits = torch.randn(timed, module.num_experts, generator=generator, device=device, dtype=torch.float32)
    weights, index = torch.softmax(logits, dim=-1).topk(top_k, dim=-1)
    weights = (weights / weights.sum(dim=-1, keepdim=True)).to(dtype).requires_grad_(True)
    wrt = [states, weights, *(p for p in module.parameters() if p.requires_grad)]
    cuda = device.type == "cuda"

    def forward_backward(path: Any) -> Any:
        def run() -> None:
            out = path(module, states, index, weights)
            torch.autograd.grad(out.float().sum(), wrt)

        return run

    timing = time_pair(
        forward_backward(loop),
        forward_backward(grouped),
        sync=(lambda: torch.cuda.synchronize(device)) if cuda else None,
        cpu_bound=not cuda,
        warmup=WARMUP,
        max_seconds=MAX_SECONDS,
    )
    dtype_name = str(dtype).removeprefix("torch.")
    return timing.scaled(tokens / timed), timed, dtype_name


class _Clock:
    """Marks on the host clock, or CUDA events on the model's device (read once the window ended)."""

    def __init__(self, device: Any) -> None:
        self.cuda = device is not None and getattr(device, "type", None) == "cuda"

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, pairs: list[tuple[Any, Any]]) -> float:
        if not self.cuda:
            return sum(end - start for start, end in pairs)
        import torch

        torch.cuda.synchronize()
        return sum(start.elapsed_time(end) for start, end in pairs) / 1000.0


def _first_tensor(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, tuple | list):
        return next((v for v in value if isinstance(v, torch.Tensor)), None)
    return None


def _in_backward() -> bool:
    """Whether autograd's engine is running a backward on this thread (a checkpointed forward run again)."""
    import torch

    task = getattr(torch._C, "_current_graph_task_id", None)
    return callable(task) and task() != -1


@collector
class ExpertsCollector(Collector):
    """Finds the expert layers at the first step; hooks them only during the measured window."""

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.info: ExpertsInfo | None = None
        self._modules: list[tuple[str, Any, bool]] = []
        self._handles: list[Any] = []
        self._clock = _Clock(None)
        self._counting = False
        self._closed = False
        self._timed = False
        self._starts: list[Any] = []  # forward starts not yet closed (a stack: calls do not interleave)
        self._forwards: list[tuple[Any, Any]] = []
        self._backwards: list[tuple[Any, Any]] = []
        self._shape: tuple[int, int, int] | None = None  # (tokens, hidden, top-k) of the first call timed

    def begin(self) -> None:
        model = self.ctx.model
        self._modules = expert_modules(model)
        if not self._modules:
            return
        env = self.ctx.environment
        _, module, dispatched = self._modules[0]
        shape = env.model if env is not None else None
        info = ExpertsInfo(
            layers=len(self._modules),
            experts=(shape.n_experts if shape else None) or self._count(module, dispatched),
            experts_per_token=shape.experts_active if shape else None,
            site=f"{type(module).__name__} ({type(module).__module__})",
        )
        transformers = sys.modules.get("transformers")
        if transformers is not None:
            info.transformers_version = getattr(transformers, "__version__", None)
        if dispatched:
            info.library = "transformers"
            info.implementation = str(module.config._experts_implementation or "eager")
            info.available = available_implementations()
            compiled = bool(env is not None and env.kernels is not None and env.kernels.compiled)
            if info.implementation == "grouped_mm":
                info.fallback = grouped_fallback(module, compiled)
        else:
            info.implementation = "loop"
            info.library = library_of(module)
        self.info = info
        self._clock = _Clock(self.ctx.device)

    @staticmethod
    def _count(module: Any, dispatched: bool) -> int | None:
        return int(module.num_experts) if dispatched else len(module.experts)

    # -- the window -------------------------------------------------------------------------------
    def start_window(self) -> None:
        self._forwards, self._backwards, self._starts = [], [], []
        if self.info is None:
            return
        self.info.calls = self.info.recomputed = self.info.backward_calls = 0
        env = self.ctx.environment
        if env is not None and env.kernels is not None and env.kernels.compiled:
            return  # hooks inside a compiled graph would break it: the implementation alone is reported
        for _, module, _ in self._modules:
            self._handles.append(module.register_forward_pre_hook(self._pre, with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._post, with_kwargs=True))
        self._counting = True

    def _pre(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._counting:
            self._starts.append(self._clock.mark())

    def _post(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if not self._counting or not self._starts:
            return
        end = self._clock.mark()
        start = self._starts.pop()
        info = self.info
        assert info is not None
        if _in_backward():
            info.recomputed += 1
        else:
            info.calls += 1
            if len(self._forwards) < MAX_PAIRS:
                self._forwards.append((start, end))
        import torch

        states = args[0] if args else kwargs.get("hidden_states")
        if self._shape is None and isinstance(states, torch.Tensor) and states.dim() >= 2:
            index = args[1] if len(args) > 1 else kwargs.get("top_k_index")
            top_k = int(index.shape[-1]) if isinstance(index, torch.Tensor) else info.experts_per_token or 1
            hidden = int(states.shape[-1])
            self._shape = (states.numel() // max(hidden, 1), hidden, top_k)
        out = _first_tensor(output)
        if (
            torch.is_grad_enabled()
            and isinstance(states, torch.Tensor)
            and states.requires_grad
            and out is not None
            and out.requires_grad
            and len(self._backwards) < MAX_PAIRS
        ):
            self._time_backward(out, states)

    def _time_backward(self, out: Any, states: Any) -> None:
        """The output's gradient arrives when the experts' backward starts; the input's is complete when it
        (and the router's, which reads the same input) has ended."""
        begun: list[Any] = []

        def output_grad(grad: Any) -> None:
            if self._counting:
                begun.append(self._clock.mark())

        def input_grad(grad: Any) -> None:
            if self._counting and begun and self.info is not None:
                self._backwards.append((begun.pop(), self._clock.mark()))
                self.info.backward_calls += 1

        out.register_hook(output_grad)
        states.register_hook(input_grad)

    def stop_window(self) -> None:
        self._counting = False
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def closing(self) -> None:
        self._closed = True

    # -- the profile ------------------------------------------------------------------------------
    def fill(self, draft: RankProfile) -> None:
        info = self.info
        if info is None:
            return
        if self._forwards:
            forward = self._clock.seconds(self._forwards) * info.calls / len(self._forwards)
            info.forward_s = forward
            info.experts_s = forward
            if self._backwards:
                info.backward_s = self._clock.seconds(self._backwards)
                info.experts_s = forward + info.backward_s
        if self._shape is not None:
            info.tokens_per_call = self._shape[0]
        if self._closed and not self._timed:
            self._timed = True
            try:
                self._time_switch(info)
            except Exception as exc:  # out of memory, no kernel for the dtype: the rule falls back
                self.ctx.errors.append(
                    f"timing the experts' loop against grouped_mm: {type(exc).__name__}: {exc}"
                )
        draft.experts = info

    def _time_switch(self, info: ExpertsInfo) -> None:
        """One expert module's loop against grouped_mm at the job's shape, where the model loops today."""
        looping = info.implementation in LOOPING or info.fallback is not None
        dispatched = [m for _, m, hf in self._modules if hf]
        if not looping or not dispatched or self._shape is None or "grouped_mm" not in info.available:
            return
        tokens, hidden, top_k = self._shape
        timing, timed, dtype = time_experts(dispatched[0], tokens, top_k, hidden)
        info.loop_s, info.grouped_s, info.timed_tokens, info.timed_dtype = (
            timing.first_s,
            timing.second_s,
            timed,
            dtype,
        )
        info.switch_spread = timing.record()
