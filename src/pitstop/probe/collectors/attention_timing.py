"""Eager attention against the fused kernel, timed once on the job's device when the window ends and the
job ends next (doctor's and tune's windows), only for a model on Transformers' eager attention path; what
``slow_attention`` estimates from (see ``probe/attention_timing.py`` for what is timed)."""

from __future__ import annotations

import statistics

from pitstop.probe.attention_timing import AttentionShape, time_attention
from pitstop.probe.collectors.base import Collector, ProbeContext, collector
from pitstop.profile import AttentionTiming, RankProfile

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


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
        eager_s, fused_s, timed = time_attention(shape)
        return AttentionTiming(
            eager_s=eager_s,
            fused_s=fused_s,
            rows=shape.rows,
            heads=shape.heads,
            seq=shape.seq,
            head_dim=shape.head_dim,
            dtype=shape.dtype,
            rows_timed=timed,
        )
