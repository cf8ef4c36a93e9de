"""Eager against fused attention timed in the job after its window: the shapes it reads from the window,
the timing itself on this CPU (a real, tiny one), and ``slow_attention``'s estimate from recorded timings."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tests.factories import profile, steps

from pitstop.core.findings import Finding
from pitstop.core.profile import AttentionInfo, AttentionTiming, RunProfile
from pitstop.core.vocabulary import Severity
from pitstop.diagnose import diagnose
from pitstop.probe.collectors.attention_timing import (
    MAX_SCORES_BYTES,
    AttentionShape,
    rows_timed,
    shape_of,
    time_attention,
)

CPU = torch.device("cpu")


def eager_profile(timing: AttentionTiming | None, wall: float = 0.1) -> RunProfile:
    p = profile(
        "cpu",
        steps(n=20, wall=wall, rows=8, row_len=384),
        attention=AttentionInfo(implementation="eager", sdpa_calls=0, sdpa_calls_with_mask=0),
    )
    p.ranks[0].attention_timing = timing
    return p


def slow_attention(p: RunProfile) -> Finding:
    return next(f for f in diagnose(p).findings if f.cause == "slow_attention")


def test_the_estimate_is_the_timed_difference_over_the_layers_of_a_step() -> None:
    """Recorded from the calibration's eager-384 job on this CPU: 32.1 ms eager, 21.4 ms fused per layer."""
    timing = AttentionTiming(
        eager_s=0.0321, fused_s=0.0214, rows=8, heads=2, seq=384, head_dim=32, dtype="float32", rows_timed=8
    )
    layers = eager_profile(None).ranks[0].environment.model.n_layers
    assert layers
    saved = (0.0321 - 0.0214) * layers
    f = slow_attention(eager_profile(timing, wall=4 * saved))  # the attention saves a quarter of the step
    assert f.est_speedup == pytest.approx(1 / (1 - 0.25), rel=1e-3)
    assert f.evidence["eager_ms_per_layer"] == 32.1 and f.evidence["fused_ms_per_layer"] == 21.4
    assert "timed on this CPU" in f.speedup_basis and "8 rows × 2 heads × 384 tokens × 32" in f.speedup_basis
    assert f.evidence["attention_flops_frac"] > 0  # the FLOPs share is still shown beside the timing


def test_a_fused_kernel_that_is_not_faster_here_is_low_and_promises_nothing() -> None:
    timing = AttentionTiming(
        eager_s=0.0020, fused_s=0.0021, rows=8, heads=2, seq=128, head_dim=32, dtype="float32", rows_timed=8
    )
    f = slow_attention(eager_profile(timing))
    assert f.est_speedup == pytest.approx(1.0) and f.severity is Severity.LOW
    assert "the fused kernel was not faster here" in f.speedup_basis


def test_without_a_timing_the_flops_share_and_the_assumed_factor_remain() -> None:
    f = slow_attention(eager_profile(None))
    assert "taken as 2× slower per FLOP" in f.speedup_basis and f.est_speedup and f.est_speedup > 1.0


def test_the_shape_is_the_windows_rows_and_row_length_and_the_models_heads() -> None:
    p = eager_profile(None)
    draft = p.ranks[0]
    shape = shape_of(draft, CPU)
    model = draft.environment.model
    assert shape is not None and model.n_heads and model.hidden_size
    assert (shape.rows, shape.seq, shape.heads) == (8, 384, model.n_heads)
    assert shape.head_dim == (model.head_dim or model.hidden_size // model.n_heads)
    sdpa = dataclasses.replace(draft.environment.attention, implementation="sdpa")
    draft.environment = dataclasses.replace(draft.environment, attention=sdpa)
    assert shape_of(draft, CPU) is None  # only the eager path is timed


def test_rows_are_fewer_when_one_layers_scores_would_be_too_large() -> None:
    small = AttentionShape(rows=8, heads=2, seq=128, head_dim=32, dtype="float32", device=CPU)
    assert rows_timed(small) == 8
    long = dataclasses.replace(small, rows=16, heads=32, seq=8192)
    assert rows_timed(long) == max(1, MAX_SCORES_BYTES // (32 * 8192 * 8192 * 4)) == 1


def test_timing_on_this_cpu_runs_both_paths_and_leaves_the_jobs_random_state_alone() -> None:
    state = torch.random.get_rng_state()
    shape = AttentionShape(rows=2, heads=2, seq=64, head_dim=16, dtype="float32", device=CPU)
    eager_s, fused_s, timed = time_attention(shape)
    assert eager_s > 0 and fused_s > 0 and timed == 2
    assert torch.equal(torch.random.get_rng_state(), state)


def test_a_timing_survives_a_saved_profile() -> None:
    timing = AttentionTiming(
        eager_s=0.01, fused_s=0.005, rows=4, heads=2, seq=64, head_dim=16, dtype="bfloat16", rows_timed=4
    )
    back = RunProfile.from_dict(eager_profile(timing).to_dict())
    assert back.ranks[0].attention_timing == timing
