"""A quantized base model: its quantized linears found and counted, and, when the window ends and the job ends
next (doctor's and tune's windows), timed against dense ones on the job's device at the job's shapes.

QLoRA-style training keeps the frozen base in 4 bits (bitsandbytes ``Linear4bit``: NF4 / FP4 weights in
``Params4bit``, their scales perhaps quantized again) or 8 bits (``Linear8bitLt``), or in a torchao quantized
tensor subclass. Each matmul dequantizes the weight first: once in the forward, once in the backward for the
input's gradient (the base gets none of its own), and once more where activation checkpointing recomputes the
forward. That is the price of the smaller memory; how large it is depends on the device, the weights' shapes
and the tokens per micro-batch, so it is timed rather than assumed: one layer of each distinct weight shape,
forward and backward of the input gradient at the job's tokens, as the job runs it and as a dense linear of
the dequantized weight in the compute dtype (what a bf16 base would run). The difference, × the layers of that
shape × the micro-batches of a step, is what a dense base would save per step. The 4-bit weights'
dequantization alone (``bitsandbytes.functional.dequantize_4bit``) is timed too, for the evidence.

Inputs come from a private generator (the job's random state is untouched), outside autocast and with grad
enabled; the quantized and dense paths are timed against each other in interleaved pairs until their ratio
is stable or time is up (``probe/timing.py``: the spread and the machine's load are kept beside the medians),
and the tokens are capped at ``MAX_TOKENS`` (times scaled back to the job's tokens).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pitstop.core.profile import QuantizedBase, RankProfile
from pitstop.ingest.configs import quantization_from_hf
from pitstop.probe.collectors.base import Collector, ProbeContext, collector
from pitstop.probe.timing import PairTiming, combined, time_pair

BNB_4BIT = ("Linear4bit", "LinearFP4", "LinearNF4")  # bitsandbytes.nn's 4-bit linears
BNB_8BIT = ("Linear8bitLt",)
MAX_TOKENS = 8192  # tokens timed at once; more are scaled linearly (the matmuls are linear in the tokens)
WARMUP = 2  # passes of each path before timing (kernel selection, allocator)
PASSES = 5  # timed passes of the dequantization alone; the median is kept
MAX_SECONDS = 4.0  # the whole measurement stops adding pairs past this (each comparison times at least three)
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass
class QuantLinear:
    """One quantized linear: the module, its library, weight shape (out, in) and real element count."""

    module: Any
    library: str
    bits: int
    quant_type: str | None
    double_quant: bool | None
    compute_dtype: str | None
    out_features: int
    in_features: int

    @property
    def params(self) -> int:
        return self.out_features * self.in_features


def _dtype_name(dtype: Any) -> str | None:
    return None if dtype is None else str(dtype).replace("torch.", "")


def quantized_linear(module: Any) -> QuantLinear | None:
    """The module as a quantized linear, or None: a bitsandbytes 4 / 8-bit linear, or a linear whose weight is
    a torchao quantized tensor. Wrappers (peft's ``lora.Linear4bit``) are not: their ``base_layer`` is."""
    cls = type(module)
    weight = getattr(module, "weight", None)
    if cls.__module__.startswith("bitsandbytes") and cls.__name__ in BNB_4BIT + BNB_8BIT:
        four = cls.__name__ in BNB_4BIT
        state = getattr(weight, "quant_state", None)
        shape = tuple(getattr(state, "shape", None) or (getattr(weight, "shape", None) or ()))
        out_f = getattr(module, "out_features", None) or (shape[0] if len(shape) == 2 else 0)
        in_f = getattr(module, "in_features", None) or (shape[1] if len(shape) == 2 else 0)
        return QuantLinear(
            module=module,
            library="bitsandbytes",
            bits=4 if four else 8,
            quant_type=(getattr(state, "quant_type", None) or getattr(weight, "quant_type", None))
            if four
            else "int8",
            double_quant=bool(getattr(state, "nested", False)) if four and state is not None else None,
            compute_dtype=_dtype_name(getattr(module, "compute_dtype", None)),
            out_features=int(out_f),
            in_features=int(in_f),
        )
    if weight is not None and type(weight).__module__.startswith("torchao"):
        shape = tuple(weight.shape)
        if len(shape) != 2:
            return None
        return QuantLinear(
            module=module,
            library="torchao",
            bits=_torchao_bits(weight),
            quant_type=type(weight).__name__,
            double_quant=None,
            compute_dtype=_dtype_name(getattr(weight, "dtype", None)),
            out_features=int(shape[0]),
            in_features=int(shape[1]),
        )
    return None


def _torchao_bits(weight: Any) -> int:
    name = type(weight).__name__.lower()
    if "nf4" in name or "int4" in name or "4" in name:
        return 4
    return 8


def quantized_linears(model: Any) -> list[QuantLinear]:
    """Every quantized linear of the model (each module once, wrappers looked through)."""
    found = []
    for module in model.modules() if hasattr(model, "modules") else ():
        layer = quantized_linear(module)
        if layer is not None:
            found.append(layer)
    return found


def _config_quantization(model: Any) -> dict[str, Any]:
    """The model's Hugging Face ``quantization_config`` as a dict ({} when none)."""
    for candidate in _unwrapped(model):
        config = getattr(getattr(candidate, "config", None), "quantization_config", None)
        if config is None:
            continue
        if isinstance(config, dict):
            return config
        to_dict = getattr(config, "to_dict", None)
        return dict(to_dict()) if callable(to_dict) else dict(vars(config))
    return {}


def _unwrapped(model: Any) -> Iterator[Any]:
    """The model and the models it wraps (DDP's ``module``, PEFT's ``base_model.model``)."""
    seen = 0
    while model is not None and seen < 6:
        yield model
        seen += 1
        model = getattr(model, "module", None) or getattr(getattr(model, "base_model", None), "model", None)


def describe(model: Any, layers: list[QuantLinear]) -> QuantizedBase | None:
    """The quantized base as the model shows it: its linears, else its config's ``quantization_config``."""
    configured = quantization_from_hf(
        _config_quantization(model), set_by="the model's quantization_config (no quantized linear found)"
    )
    if not layers:
        return configured
    first = layers[0]
    shapes = sorted({(q.out_features, q.in_features) for q in layers})
    return QuantizedBase(
        library=first.library,
        quant_type=first.quant_type or (configured.quant_type if configured else None),
        bits=first.bits,
        # bitsandbytes may repack a CPU weight at its first forward, losing the nested state: the config says
        double_quant=first.double_quant or (configured.double_quant if configured else None),
        compute_dtype=first.compute_dtype or (configured.compute_dtype if configured else None),
        layers=len(layers),
        params_quantized=sum(q.params for q in layers),
        shapes=[list(s) for s in shapes],
        set_by=f"the model's linears ({type(first.module).__name__})",
    )


# -- timing -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerTiming:
    """One layer timed at ``tokens`` (seconds): as the job runs it and as a dense linear, forward alone and
    forward + backward of the input gradient; the weight's dequantization alone (None where not timed)."""

    quantized_fwd: float
    quantized_fwd_bwd: float
    dense_fwd: float
    dense_fwd_bwd: float
    dequant: float | None
    fwd_bwd_pairs: PairTiming | None = None  # forward + backward, quantized over dense, in interleaved pairs
    fwd_pairs: PairTiming | None = None  # the forward alone (the checkpointed recompute)


def _four_bit(weight: Any) -> tuple[Any, Any]:
    """A 4-bit weight's data and quant state as ``dequantize_4bit`` takes them. On a CPU, bitsandbytes repacks
    a weight in place for its inference kernel (an eval-mode forward without grad); read back through its own
    inverse, without touching the module."""
    import bitsandbytes.functional as bnb_f

    data, state = weight.data, weight.quant_state
    if getattr(state, "packing_format_for_cpu", False):
        data, state = bnb_f._convert_weight_packed_for_cpu_inverse(data, state)
    return data, state


def dense_weight(layer: QuantLinear, dtype: Any) -> Any:
    """The layer's weight dequantized, in ``dtype``: what a dense base would hold."""
    weight = layer.module.weight
    if layer.library == "bitsandbytes":
        import bitsandbytes.functional as bnb_f

        if layer.bits == 4:
            return bnb_f.dequantize_4bit(*_four_bit(weight)).to(dtype)
        return bnb_f.int8_vectorwise_dequant(weight.CB, weight.SCB).to(dtype)
    return weight.dequantize().to(dtype)


def dequantizer(layer: QuantLinear) -> Callable[[], Any] | None:
    """The weight's dequantization alone, where the library exposes it (bitsandbytes 4-bit)."""
    if layer.library == "bitsandbytes" and layer.bits == 4:
        import bitsandbytes.functional as bnb_f

        data, state = _four_bit(layer.module.weight)
        return lambda: bnb_f.dequantize_4bit(data, state)
    return None


def time_layer(layer: QuantLinear, tokens: int, dtype_name: str, device: Any, deadline: float) -> LayerTiming:
    """The layer at ``tokens`` rows, as the job runs it and dense. Raises what torch raises (out of memory)."""
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, dtype_name)
    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.randn((tokens, layer.in_features), generator=generator, device=device, dtype=dtype)
    x.requires_grad_(True)
    weight = dense_weight(layer, dtype)
    cuda = getattr(device, "type", str(device)) == "cuda"

    sync = (lambda: torch.cuda.synchronize(device)) if cuda else None

    def timed(run: Callable[[], Any]) -> float:
        """A path alone (the dequantization, for the evidence): the median of a few passes."""
        seconds: list[float] = []
        for i in range(WARMUP + PASSES):
            if i > WARMUP and time.perf_counter() > deadline:
                break
            if cuda:
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            run()
            if cuda:
                torch.cuda.synchronize(device)
            if i >= WARMUP:
                seconds.append(time.perf_counter() - t0)
            x.grad = None
        return statistics.median(seconds)

    def paired(quantized: Callable[[], Any], dense: Callable[[], Any]) -> PairTiming:
        """Quantized (first) against dense (second) in interleaved pairs, until stable or the deadline."""
        return time_pair(
            quantized,
            dense,
            sync=sync,
            cpu_bound=not cuda,
            warmup=WARMUP,
            max_seconds=max(0.0, deadline - time.perf_counter()),
        )

    # forwards with grad, as in training: an eval-mode forward without grad would have bitsandbytes repack the
    # job's CPU weight in place
    def quantized_fwd() -> Any:
        return layer.module(x)

    def quantized_fwd_bwd() -> None:
        layer.module(x).sum().backward()
        x.grad = None

    def dense_fwd() -> Any:
        return F.linear(x, weight)

    def dense_fwd_bwd() -> None:
        F.linear(x, weight).sum().backward()
        x.grad = None

    dequant = dequantizer(layer)
    fwd_bwd = paired(quantized_fwd_bwd, dense_fwd_bwd)
    fwd = paired(quantized_fwd, dense_fwd)
    return LayerTiming(
        quantized_fwd=fwd.first_s,
        quantized_fwd_bwd=fwd_bwd.first_s,
        dense_fwd=fwd.second_s,
        dense_fwd_bwd=fwd_bwd.second_s,
        dequant=None if dequant is None else timed(dequant),
        fwd_bwd_pairs=fwd_bwd,
        fwd_pairs=fwd,
    )


def time_quantized(
    base: QuantizedBase,
    layers: list[QuantLinear],
    tokens: int,
    micro_batches: int,
    checkpointing: bool,
    device: Any,
    where: str,
) -> QuantizedBase:
    """``base`` with its timing: one layer of each distinct weight shape timed, × the layers of that shape."""
    import torch

    timed_tokens = max(1, min(tokens, MAX_TOKENS))
    scale = tokens / timed_tokens
    dtype = base.compute_dtype if base.compute_dtype in ("bfloat16", "float16", "float32") else "float32"
    by_shape: dict[tuple[int, int], list[QuantLinear]] = {}
    for layer in layers:
        by_shape.setdefault((layer.out_features, layer.in_features), []).append(layer)
    deadline = time.perf_counter() + MAX_SECONDS
    quantized = dense = 0.0
    dequant: float | None = 0.0
    pairs: list[tuple[PairTiming, float]] = []  # each compared path and how often a micro-batch runs it
    with torch.enable_grad(), torch.autocast(device_type=getattr(device, "type", "cpu"), enabled=False):
        for group in by_shape.values():
            t = time_layer(group[0], timed_tokens, dtype, device, deadline)
            n = len(group)
            # forward + backward of the input gradient; with checkpointing the forward once more
            quantized += n * (t.quantized_fwd_bwd + (t.quantized_fwd if checkpointing else 0.0))
            dense += n * (t.dense_fwd_bwd + (t.dense_fwd if checkpointing else 0.0))
            if t.fwd_bwd_pairs is not None:
                pairs.append((t.fwd_bwd_pairs, n))
            if t.fwd_pairs is not None and checkpointing:
                pairs.append((t.fwd_pairs, n))
            passes = 3 if checkpointing else 2
            dequant = None if dequant is None or t.dequant is None else dequant + n * passes * t.dequant
    quantized, dense = quantized * scale, dense * scale
    base.timed_on = where
    base.tokens_timed = timed_tokens
    base.quantized_s = quantized
    base.dense_s = dense
    base.dequant_s = dequant
    base.passes = 3 if checkpointing else 2
    base.micro_batches = micro_batches
    base.dequant_s_per_step = max(0.0, quantized - dense) * micro_batches
    base.spread = combined(pairs)
    return base


def tokens_per_micro_batch(draft: RankProfile) -> tuple[int, int] | None:
    """(tokens per micro-batch, micro-batches per step) from the window's steps; None when unknown."""
    tokens = []
    for s in draft.steps:
        micro = max(s.micro_batches, 1)
        count = s.tokens or ((s.samples or 0) * (s.seq_len or 0))
        if count:
            tokens.append(count / micro)
    if not tokens:
        return None
    micro_batches = statistics.median(max(s.micro_batches, 1) for s in draft.steps)
    return max(1, round(statistics.median(tokens))), max(1, round(micro_batches))


@collector
class QuantizedCollector(Collector):
    order = 91  # after attention timing: both spend the job's time only once the window has ended

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.layers: list[QuantLinear] = []
        self.base: QuantizedBase | None = None
        self.closed = False
        self.tried = False

    def begin(self) -> None:
        model = self.ctx.model
        if model is None:
            return
        self.layers = quantized_linears(model)
        self.base = describe(model, self.layers)

    def closing(self) -> None:
        self.closed = True

    def fill(self, draft: RankProfile) -> None:
        if self.base is not None and self.layers and self.closed and not self.tried:
            self.tried = True
            try:
                self._measure(draft, self.base)
            except Exception as exc:  # out of memory, no kernel for the dtype: the rule goes without a timing
                self.ctx.errors.append(f"timing the quantized linears: {type(exc).__name__}: {exc}")
        draft.quantized_base = self.base

    def _measure(self, draft: RankProfile, base: QuantizedBase) -> None:
        shape = tokens_per_micro_batch(draft)
        device = self.ctx.device
        if shape is None or device is None:
            return
        if base.compute_dtype is None:
            base.compute_dtype = DTYPES.get(
                draft.environment.autocast_dtype or draft.environment.param_dtype or ""
            )
        env = draft.environment
        where = str(getattr(device, "type", device))
        if env.gpu_name and where == "cuda":
            where += f" ({env.gpu_name})"
        tokens, micro = shape
        # the layers' own device: under a device map the first quantized layer's, else the job's
        weight = getattr(self.layers[0].module, "weight", None)
        layer_device = getattr(weight, "device", None) or device
        time_quantized(
            base, self.layers, tokens, micro, bool(env.gradient_checkpointing), layer_device, where
        )
