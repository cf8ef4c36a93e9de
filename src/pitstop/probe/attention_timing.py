"""Eager attention against the fused kernel, timed on the job's own device at the job's own shapes.

``slow_attention`` needs to know how much faster the fused kernel is than the eager path where the job runs:
the gap depends on the device, the dtype, the row length and the head size (on a CPU the fused kernel gains
little at short rows, where the score matrices stay in cache; on a GPU FlashAttention-style kernels gain most
at long ones). A fixed factor cannot say it; a few forward-and-backward passes of one layer's attention can.

Eager is what a Transformers model's eager path computes: ``q·kᵀ`` scaled, a causal mask added, softmax in
fp32, ``·v``. Fused is ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)``, what the
SDPA path calls for causal rows. Both run on the inputs of a private generator (the job's random state is
untouched), forward and backward, and the median of a few timed passes after a warm-up is kept. The rows are
the job's micro-batch, fewer when one layer's scores would pass ``MAX_SCORES_BYTES`` (the job's own
tensors are still in memory), and the times scaled back to the job's rows.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

MAX_SCORES_BYTES = 256 * 2**20  # one layer's S×S scores over the rows timed at once
WARMUP = 2  # passes of each path before timing (kernel selection, allocator)
PASSES = 5  # timed passes of each path; the median is kept
MAX_SECONDS = 3.0  # the whole measurement stops adding passes past this


@dataclass(frozen=True)
class AttentionShape:
    """One layer's attention as the job computes it: rows of the micro-batch, query heads, row length, head
    size, dtype name, and the torch device."""

    rows: int
    heads: int
    seq: int
    head_dim: int
    dtype: str
    device: Any


def rows_timed(shape: AttentionShape) -> int:
    """Rows timed at once: the job's, fewer when one layer's scores would not fit ``MAX_SCORES_BYTES``."""
    per_row = shape.heads * shape.seq * shape.seq * 4  # the fp32 softmax's scores
    return max(1, min(shape.rows, MAX_SCORES_BYTES // max(per_row, 1)))


def time_attention(shape: AttentionShape) -> tuple[float, float, int]:
    """(eager seconds, fused seconds) for one layer's forward and backward over the job's rows, and the rows
    actually timed at once. Raises what torch raises (out of memory, no kernel for the dtype)."""
    import torch
    import torch.nn.functional as F

    rows = rows_timed(shape)
    dtype = getattr(torch, shape.dtype)
    generator = torch.Generator(device=shape.device).manual_seed(0)
    size = (rows, shape.heads, shape.seq, shape.head_dim)

    def leaf() -> Any:
        x = torch.randn(size, generator=generator, device=shape.device, dtype=dtype)
        return x.requires_grad_(True)

    q, k, v = leaf(), leaf(), leaf()
    mask = torch.full((shape.seq, shape.seq), float("-inf"), device=shape.device, dtype=dtype).triu(1)
    scale = 1.0 / math.sqrt(shape.head_dim)

    def eager() -> Any:
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale + mask
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
        return torch.matmul(weights, v)

    def fused() -> Any:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    cuda = shape.device.type == "cuda"
    started = time.perf_counter()

    def timed(path: Any) -> float:
        seconds: list[float] = []
        for i in range(WARMUP + PASSES):
            if i > WARMUP and time.perf_counter() - started > MAX_SECONDS:
                break
            if cuda:
                torch.cuda.synchronize(shape.device)
            t0 = time.perf_counter()
            path().sum().backward()
            if cuda:
                torch.cuda.synchronize(shape.device)
            if i >= WARMUP:
                seconds.append(time.perf_counter() - t0)
            q.grad = k.grad = v.grad = None
        return statistics.median(seconds)

    scale_rows = shape.rows / rows
    return timed(eager) * scale_rows, timed(fused) * scale_rows, rows
