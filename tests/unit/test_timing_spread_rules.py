"""The rules that read a timing pitstop ran itself (slow_attention, moe_experts_loop, quantized_base), stable
against noisy: a noisy timing lowers the confidence, says "timed under load / noisy: ×a–×b", and grades the
severity on the range's lower end, so it cannot raise a severity its lower end would not give; a stable one
keeps the cause's confidence and shows its pairs; a profile without a spread reads as before."""

from __future__ import annotations

import dataclasses

import pytest
from tests.factories import profile, steps

from pitstop.core.findings import Finding
from pitstop.core.profile import (
    AttentionInfo,
    AttentionTiming,
    ExpertsInfo,
    QuantizedBase,
    RunProfile,
    TimingSpread,
)
from pitstop.core.vocabulary import CauseId, Severity
from pitstop.diagnose import diagnose
from pitstop.diagnose.causes import moe_experts_loop as moe_rule
from pitstop.diagnose.causes import quantized_base as quantized_rule
from pitstop.diagnose.causes import slow_attention as attention_rule
from pitstop.diagnose.context import RuleContext

# recorded on this 2-core machine by ``measure_attention`` at tests/scripts/newcomer_trainer.py's shapes (8 rows
# × 4 heads × 256 tokens × 32, fp32) while a CI run kept it busy (load average 7.1), twice in a row: the eager
# path took 663 ms then 94 ms (its many small parallel operations suffer most from the load), the fused one
# 91 ms then 29 ms; other processes kept 1.3 of the 2 cores busy, so each range reaches ×1 (no gain)
UNDER_LOAD = TimingSpread(
    ratio=7.297,
    ratio_low=1.0,
    ratio_high=8.330,
    repeats=5,
    stable=False,
    under_load=True,
    others_cores=1.31,
    load_per_core=3.57,
    cores=2,
)
NOISY_ATTENTION = AttentionTiming(
    eager_s=0.66256,
    fused_s=0.09080,
    rows=8,
    heads=4,
    seq=256,
    head_dim=32,
    dtype="float32",
    rows_timed=8,
    spread=UNDER_LOAD,
)
NOISY_AGAIN = dataclasses.replace(
    NOISY_ATTENTION,
    eager_s=0.09447,
    fused_s=0.02927,
    spread=TimingSpread(
        ratio=3.235,
        ratio_low=0.651,
        ratio_high=11.939,
        repeats=32,
        stable=False,
        under_load=True,
        others_cores=1.35,
        load_per_core=3.45,
        cores=2,
    ),
)
# the same medians as a quiet machine would time them: the pairs settle within 5% of their median
SETTLED = TimingSpread(
    ratio=7.297, ratio_low=7.12, ratio_high=7.47, repeats=5, stable=True, others_cores=0.05, cores=2
)
STABLE_ATTENTION = dataclasses.replace(NOISY_ATTENTION, spread=SETTLED)


def attention_profile(timing: AttentionTiming, saved_share: float = 0.25) -> RunProfile:
    """An eager job whose attention, at the timing's medians, saves ``saved_share`` of the step."""

    def eager(wall: float) -> RunProfile:
        return profile(
            "cpu",
            steps(n=20, wall=wall, rows=8, row_len=256),
            attention=AttentionInfo(implementation="eager", sdpa_calls=0, sdpa_calls_with_mask=0),
        )

    layers = eager(1.0).ranks[0].environment.model.n_layers
    assert layers
    p = eager((timing.eager_s - timing.fused_s) * layers / saved_share)
    p.ranks[0].attention_timing = timing
    return p


def slow_attention(p: RunProfile) -> Finding:
    return next(f for f in diagnose(p).findings if f.cause == CauseId.SLOW_ATTENTION)


def test_a_stable_attention_timing_keeps_its_confidence_and_grades_on_its_lower_quartile() -> None:
    f = slow_attention(attention_profile(STABLE_ATTENTION))
    assert f.est_speedup == pytest.approx(1 / (1 - 0.25), rel=1e-3)
    assert f.severity is Severity.HIGH and f.confidence == pytest.approx(0.95)
    ev = f.evidence
    assert ev["timing_repeats"] == 5 and ev["timing_stable"] is True
    assert ev["eager_over_fused_range"] == [7.12, 7.47]
    low, high = ev["est_speedup_range"]  # type: ignore[misc]
    assert 1.25 < low <= f.est_speedup <= high  # type: ignore[operator]
    assert "stable over 5 interleaved pairs" in f.speedup_basis
    assert "noisy" not in f.summary


def test_a_noisy_attention_timing_under_load_is_graded_on_its_lower_end_at_a_lower_confidence() -> None:
    stable = slow_attention(attention_profile(STABLE_ATTENTION))
    f = slow_attention(attention_profile(NOISY_ATTENTION))
    # the medians are the same, so the point estimate is; the range reaches ×1 (no gain): graded low
    assert f.est_speedup == pytest.approx(stable.est_speedup)
    assert f.severity is Severity.LOW
    assert f.confidence == pytest.approx(attention_rule.NOISY_CONFIDENCE) and f.confidence < stable.confidence
    ev = f.evidence
    assert ev["timing_repeats"] == 5 and ev["timing_stable"] is False and ev["timing_under_load"] is True
    assert ev["timing_others_cores"] == 1.31 and ev["eager_over_fused_range"] == [1.0, 8.33]
    low, high = ev["est_speedup_range"]  # type: ignore[misc]
    assert low == 1.0 and f.est_speedup < high  # type: ignore[operator]
    said = f"timed under load (other processes kept 1.3 of the job's 2 cores busy), noisy: ×1.00–×{high:.2f}"
    assert said in f.summary and said in f.speedup_basis
    assert "the severity follows the range's lower end" in f.speedup_basis


def test_a_noisy_timing_whose_lower_end_is_high_stays_high_but_less_sure() -> None:
    """The lower end bounds the severity from above, never from below: a noisy range (no load seen) all above
    the HIGH line keeps HIGH at the lower confidence; its upper end never raises it."""
    high_low = dataclasses.replace(UNDER_LOAD, ratio_low=7.0, ratio_high=30.0, under_load=False)
    f = slow_attention(attention_profile(dataclasses.replace(NOISY_ATTENTION, spread=high_low)))
    assert f.severity is Severity.HIGH and f.confidence == pytest.approx(attention_rule.NOISY_CONFIDENCE)
    assert "timed noisy: ×" in f.summary


def test_two_runs_under_load_grade_alike_though_their_medians_swing() -> None:
    """Two timings of the same shapes recorded one after the other under the same load: eager over fused
    ×7.3 and ×3.2 by their medians, two very different point estimates; both ranges reach ×1, so both grade
    low, where the medians alone would have graded one high and one low (the issue's swing)."""
    first = attention_profile(NOISY_ATTENTION)
    second = attention_profile(NOISY_ATTENTION)  # the same job, the same step time
    second.ranks[0].attention_timing = NOISY_AGAIN
    one, two = slow_attention(first), slow_attention(second)
    assert one.est_speedup is not None and two.est_speedup is not None
    assert one.est_speedup > 1.25 > 1.1 > two.est_speedup  # by the medians: high, then low
    assert one.severity is two.severity is Severity.LOW
    assert two.evidence["timing_repeats"] == 32


def test_a_profile_without_a_spread_reads_as_before() -> None:
    f = slow_attention(attention_profile(dataclasses.replace(STABLE_ATTENTION, spread=None)))
    assert f.severity is Severity.HIGH and f.confidence == pytest.approx(0.95)
    assert "timing_repeats" not in f.evidence and "interleaved" not in f.speedup_basis


# -- moe_experts_loop: experts 60% of the step, the loop 20 ms against grouped_mm 4 ms a call ---------------


def experts(spread: TimingSpread | None) -> ExpertsInfo:
    return ExpertsInfo(
        layers=2,
        experts=32,
        experts_per_token=2,
        implementation="eager",
        available=["eager", "batched_mm", "grouped_mm"],
        site="MixtralExperts (transformers.models.mixtral.modeling_mixtral)",
        library="transformers",
        transformers_version="5.25.0",
        calls=20,
        forward_s=0.2,
        backward_s=0.4,
        backward_calls=20,
        experts_s=0.6,
        tokens_per_call=512,
        loop_s=0.020,
        grouped_s=0.004,
        timed_tokens=512,
        timed_dtype="float32",
        switch_spread=spread,
    )


def moe_finding(spread: TimingSpread | None) -> Finding:
    p = profile("cpu", steps(n=10, wall=0.1))
    p.source = "doctor"  # type: ignore[assignment]
    p.ranks[0].experts = experts(spread)
    f = moe_rule.moe_experts_loop(RuleContext.of(p))
    assert f is not None
    return f


def test_moe_a_stable_switch_timing_is_high_and_a_noisy_one_is_graded_on_its_lower_end() -> None:
    settled = TimingSpread(ratio=5.0, ratio_low=4.8, ratio_high=5.3, repeats=6, stable=True, cores=2)
    stable = moe_finding(settled)
    assert stable.severity is Severity.HIGH and stable.confidence == moe_rule.LIVE_CONFIDENCE
    assert stable.evidence["timing_repeats"] == 6 and stable.evidence["grouped_speedup_range"] == [4.8, 5.3]
    # timed noisy (no load seen): the loop ×1.05 to ×7 of grouped_mm; at ×1.05 grouping saves 3% of the step
    wide = TimingSpread(ratio=5.0, ratio_low=1.05, ratio_high=7.0, repeats=41, stable=False, cores=2)
    noisy = moe_finding(wide)
    assert noisy.est_speedup == pytest.approx(stable.est_speedup)  # the medians' estimate is kept
    assert noisy.severity is Severity.LOW and noisy.confidence == moe_rule.NOISY_CONFIDENCE
    low, high = noisy.evidence["est_speedup_range"]  # type: ignore[misc]
    assert low == pytest.approx(1 / (0.4 + 0.6 / 1.05), rel=1e-3) and high > noisy.est_speedup
    assert "timed noisy: ×" in noisy.summary and "41 interleaved pairs spread" in noisy.speedup_basis
    assert moe_finding(None).severity is Severity.HIGH  # an older profile: the medians grade it


# -- quantized_base: the dequantization a quarter of the step at the medians ----------------------------------

TIMED_BASE = QuantizedBase(
    library="bitsandbytes",
    quant_type="nf4",
    bits=4,
    double_quant=True,
    compute_dtype="float32",
    layers=28,
    params_quantized=16_777_216,
    shapes=[[512, 512], [512, 2048], [2048, 512]],
    set_by="the model's linears (Linear4bit)",
    timed_on="cpu",
    tokens_timed=64,
    quantized_s=0.0286,
    dense_s=0.0179,
    dequant_s=0.0071,
    passes=2,
    micro_batches=1,
    dequant_s_per_step=0.0107,
)


def quantized_finding(spread: TimingSpread | None) -> Finding:
    p = profile("cpu", steps(n=12, wall=0.0107 * 4, rows=8, row_len=64))
    p.ranks[0].quantized_base = dataclasses.replace(TIMED_BASE, spread=spread)
    f = quantized_rule.quantized_base(RuleContext.of(p))
    assert f is not None
    return f


def test_quantized_a_noisy_timing_cannot_make_the_trade_medium() -> None:
    settled = TimingSpread(ratio=1.6, ratio_low=1.57, ratio_high=1.63, repeats=5, stable=True, cores=2)
    stable = quantized_finding(settled)
    assert stable.severity is Severity.MEDIUM and stable.confidence == quantized_rule.TIMED_CONFIDENCE
    assert stable.evidence["quantized_over_dense_range"] == [1.57, 1.63]
    loaded = TimingSpread(
        ratio=1.6,
        ratio_low=1.0,  # under load the range reaches no gain (``probe/timing.py``)
        ratio_high=2.2,
        repeats=9,
        stable=False,
        under_load=True,
        others_cores=1.2,
        cores=2,
    )
    noisy = quantized_finding(loaded)
    assert noisy.est_speedup == pytest.approx(stable.est_speedup)
    assert noisy.severity is Severity.LOW and noisy.confidence == quantized_rule.NOISY_CONFIDENCE
    assert "timed under load (other processes kept 1.2 of the job's 2 cores busy), noisy" in noisy.summary
    assert noisy.evidence["timing_repeats"] == 9 and noisy.evidence["timing_under_load"] is True
