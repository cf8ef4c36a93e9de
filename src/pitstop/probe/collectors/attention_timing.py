"""Eager attention against the fused kernel, timed on the job's own device at the job's own shapes: the
measurement (``time_attention``) and its collector, which runs it once, when the window ends and the job ends
next (doctor's and tune's windows), and only for a model on Transformers' eager attention path.

``slow_attention`` needs to know how much faster the fused kernel is than the eager path where the job runs:
the gap depends on the device, the dtype, the row length and the head size (on a CPU the fused kernel gains
little at short rows, where the score matrices stay in cache; on a GPU FlashAttention-style kernels gain most
at long ones). A fixed factor cannot say it; a few forward-and-backward passes of one layer's attention can.

Eager is what a Transformers model's eager path computes: ``q·kᵀ`` scaled, a causal mask added, softmax in
fp32, ``·v``. Fused is ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)``, what the
SDPA path calls for causal rows. Both run on the inputs of a private generator (the job's random state is
untouched), forward and backward, timed against each other in interleaved pairs until their ratio is stable
or ``MAX_SECONDS`` has passed (``probe/timing.py``): the medians, the ratio's quartiles, the pairs and the
machine's load meanwhile are kept, so a timing run beside other work is reported as noisy, not as a fact. The
rows are the job's micro-batch, fewer when one layer's scores would pass ``MAX_SCORES_BYTES`` (the job's own
tensors are still in memory), and the times scaled back to the job's rows.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from pitstop.core.profile import AttentionTiming, RankProfile
from pitstop.probe.collectors.base import Collector, ProbeContext, collector
from pitstop.probe.timing import PairTiming, time_pair

MAX_SCORES_BYTES = 256 * 2**20  # one layer's S×S scores over the rows timed at once
WARMUP = 2  # passes of each path before timing (kernel selection, allocator)
MAX_SECONDS = 4.0  # the interleaved pairs stop past this (at least three are timed), stable or not
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


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
    timing, rows = measure_attention(shape)
    return timing.first_s, timing.second_s, rows


def measure_attention(shape: AttentionShape) -> tuple[PairTiming, int]:
    """Eager (first) against fused (second) attention, forward and backward, timed in interleaved pairs over
    the rows timed at once and scaled to the job's rows; and those rows. Raises what torch raises."""
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

    def eager() -> None:
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale + mask
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
        torch.matmul(weights, v).sum().backward()
        q.grad = k.grad = v.grad = None

    def fused() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        q.grad = k.grad = v.grad = None

    cuda = shape.device.type == "cuda"
    timing = time_pair(
        eager,
        fused,
        sync=(lambda: torch.cuda.synchronize(shape.device)) if cuda else None,
        cpu_bound=not cuda,
        warmup=WARMUP,
        max_seconds=MAX_SECONDS,
    )
    return timing.scaled(shape.rows / rows), rows


def shape_of(draft: RankProfile, device: object) -> AttentionShape | None:
    """The job's attention as the window saw it; None when it is not the eager path or a shape is unknown."""
    env = draft.environment
    model = env.model
    if env.attention.implementation != "eager" or not model.n_heads or device is None:
        return None
    head_dim = model.head_dim or (model.hidden_size // model.n_heads if model.hidden_size else None)
    rows = [s.samples / max(s.micro_batches, 1) for s in draft.steps if s.samples]
    seqs = [s.seq_len for s in draft.steps if s.seq_len]
    dtype = TORCH_DTYPES.get(env.autocast_dtype or env.param_dtype or "")
    if not head_dim or not rows or not seqs or dtype is None:
        return None
    return AttentionShape(
        rows=max(1, round(statistics.median(rows))),
        heads=model.n_heads,
        seq=round(statistics.median(seqs)),
        head_dim=head_dim,
        dtype=dtype,
        device=device,
    )


@collector
class AttentionTimingCollector(Collector):
    order = 90  # after the others: it reads the environment they filled

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.closed = False  # the window ended and the job ends next: the timing may run
        self.timing: AttentionTiming | None = None
        self.tried = False

    def closing(self) -> None:
        self.closed = True

    def fill(self, draft: RankProfile) -> None:
        if self.closed and not self.tried:
            self.tried = True
            try:
                self.timing = self._measure(draft)
            except Exception as exc:  # out of memory, no kernel for the dtype: the rule falls back
                self.ctx.errors.append(f"timing eager against fused attention: {type(exc).__name__}: {exc}")
        draft.attention_timing = self.timing

    def _measure(self, draft: RankProfile) -> AttentionTiming | None:
        shape = shape_of(draft, self.ctx.device)
        if shape is None:
            return None
        timing, timed = measure_attention(shape)
        return AttentionTiming(
            eager_s=timing.first_s,
            fused_s=timing.second_s,
            rows=shape.rows,
            heads=shape.heads,
            seq=shape.seq,
            head_dim=shape.head_dim,
            dtype=shape.dtype,
            rows_timed=timed,
            spread=timing.record(),
        )
