"""The batch a traced step ran, from the operators' recorded input shapes (``record_shapes=True`` writes
"Input Dims" on every operator), and how the step's GPU time would scale with it.

Why: a trace alone says the GPU is idle, not whether a larger batch would fill it. The batch is the
leading dimension of the model's first layer's input (an embedding's token ids, a linear's or a
convolution's input); the same layer, seen once per forward, says how many forwards a step runs. The
GEMMs' shapes give the matrix FLOPs per step. How the kernels would scale is read from their durations: a
kernel has a latency floor (launch, ramp-up, a wave that is not full) that a larger batch does not
lengthen, and the time above it grows with the batch.

The event loop (events.py) hands every matmul, embedding and convolution operator to ``ShapeLog.add``
while it reads the trace; ``trace/batch.py`` turns the log and the kernels into a ``TraceBatch`` once the
steps are known. A trace recorded without shapes gives None.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import Any

# a model's first layer, by the operator a module runs (the input's index in "Input Dims")
LAYER_INPUT = {"aten::embedding": 1, "aten::linear": 0, "aten::convolution": 0}
# where no module-level operator was recorded (a compiled graph calls the GEMMs directly)
GEMM_INPUT = {"aten::addmm": 1, "aten::mm": 0, "aten::matmul": 0}
SHAPE_ONLY_OPS = ("aten::embedding", "aten::convolution")  # the shapes are all the event loop keeps of them
KERNEL_FLOOR_US = 5.0  # a kernel's time that a larger batch does not lengthen (launch, ramp-up, tail wave)
_TOKEN_TYPES = ("long", "int", "long int", "int64", "int32")


@dataclass
class _Layer:
    """One layer (operator and weight shape): when it first ran, and the leading dimension of each call."""

    first_ts: float = math.inf
    ts: array = field(default_factory=lambda: array("d"))
    lead: array = field(default_factory=lambda: array("q"))
    tokens: array = field(default_factory=lambda: array("q"))  # embedding ids per call; 0 otherwise


def _dims(value: Any) -> list[list[int]] | None:
    """ "Input Dims" as lists of ints (a scalar or a tensor list is an empty or nested entry), None if not
    that shape."""
    if not isinstance(value, list):
        return None
    out: list[list[int]] = []
    for entry in value:
        if isinstance(entry, list) and all(type(d) is int for d in entry):
            out.append(entry)
        else:
            out.append([])
    return out


def gemm_flop(name: str, dims: list[list[int]]) -> float:
    """The multiply-adds (×2) of one GEMM operator from its input shapes; 0 when they do not fit."""
    try:
        if name == "aten::mm":
            (n, k), (k2, m) = dims[0], dims[1]
            return 2.0 * n * k * m if k == k2 else 0.0
        if name == "aten::addmm":
            (n, k), (k2, m) = dims[1], dims[2]
            return 2.0 * n * k * m if k == k2 else 0.0
        if name in ("aten::bmm", "aten::baddbmm"):
            a, b = (dims[0], dims[1]) if name == "aten::bmm" else (dims[1], dims[2])
            (bat, n, k), (_, k2, m) = a, b
            return 2.0 * bat * n * k * m if k == k2 else 0.0
    except (ValueError, IndexError, TypeError):
        return 0.0
    return 0.0


@dataclass
class ShapeLog:
    """What the event loop keeps of operators' shapes: the layers that may be the model's first, and
    each GEMM's time and FLOPs. Bounded by the number of such operators (two numbers each). A dataclass, so
    the C and Python loops' columns compare field by field."""

    layers: dict[tuple[str, tuple[int, ...]], _Layer] = field(default_factory=dict)
    gemm_ts: array = field(default_factory=lambda: array("d"))
    gemm_flop: array = field(default_factory=lambda: array("d"))
    shaped: int = 0  # operators that carried "Input Dims"

    def add(self, name: str, ts: float, dims_value: Any, types: Any) -> None:
        dims = _dims(dims_value)
        if not dims:
            return
        self.shaped += 1
        flop = gemm_flop(name, dims)
        if flop:
            self.gemm_ts.append(ts)
            self.gemm_flop.append(flop)
        at = LAYER_INPUT.get(name, GEMM_INPUT.get(name))
        if at is None or len(dims) <= at:
            return
        w_at = 0 if name == "aten::embedding" else 2 if name == "aten::addmm" else 1
        if len(dims) <= w_at:
            return
        x, weight = dims[at], dims[w_at]
        if len(x) < (1 if name == "aten::embedding" else 2):
            return  # an unbatched input: no batch dimension to read
        tokens = 0
        if name == "aten::embedding":
            kind = types[1] if isinstance(types, list) and len(types) > 1 else None
            if kind is not None and str(kind) not in _TOKEN_TYPES:
                return
            tokens = math.prod(x)
            if len(x) < 2:  # flattened ids: the tokens are known, the samples are not
                x = [0, *x]
        layer = self.layers.setdefault((name, tuple(weight)), _Layer())
        layer.first_ts = min(layer.first_ts, ts)
        layer.ts.append(ts)
        layer.lead.append(x[0])
        layer.tokens.append(tokens)

    def first_layer(self) -> tuple[str, tuple[int, ...], _Layer] | None:
        """The layer that ran first: a module's operator where any was recorded, else a GEMM's."""
        for names in (LAYER_INPUT, GEMM_INPUT):
            found = [(layer.first_ts, key) for key, layer in self.layers.items() if key[0] in names]
            if found:
                _, key = min(found)
                return key[0], key[1], self.layers[key]
        return None
