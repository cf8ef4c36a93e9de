"""Eager against fused attention timed on a real GPU (issue 27): what ``slow_attention`` estimates from when
the job runs there, against the 3× per FLOP it assumes where nothing was timed."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.parametrize("seq", [512, 2048])
def test_eager_and_fused_attention_timed_in_bf16(seq: int, figure: Any) -> None:
    import torch

    from pitstop.probe.collectors.attention_timing import AttentionShape, time_attention

    device = torch.device("cuda", 0)
    state = torch.cuda.get_rng_state(device)
    shape = AttentionShape(rows=8, heads=16, seq=seq, head_dim=128, dtype="bfloat16", device=device)
    eager_s, fused_s, rows = time_attention(shape)
    figure("eager_ms", round(eager_s * 1000, 3))
    figure("fused_ms", round(fused_s * 1000, 3))
    figure("eager_over_fused", round(eager_s / fused_s, 2))
    assert rows == 8 and eager_s > 0 and fused_s > 0
    assert eager_s > fused_s  # FlashAttention-style SDPA beats the materialized scores on any recent GPU
    assert torch.equal(torch.cuda.get_rng_state(device), state)  # a private generator: the job's untouched
