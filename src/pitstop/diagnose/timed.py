"""How the rules read a comparison pitstop timed itself after a window (``TimingSpread``: eager against fused
attention, the experts' loop against grouped GEMMs, quantized against dense linears): the range its
estimate may lie in, the words that say it was noisy, and its evidence.

A timing run beside other work can move an estimate by tens of percent between two runs of the same script.
The point estimate stays the medians'; the range comes from the per-pair ratios (their quartiles where the
timing settled, every pair where it did not, down to ×1 where it ran under load: ``probe/timing.py``); a rule
grades its severity on the range's conservative end, so a noisy timing cannot raise a severity its lower end
would not give, and lowers its confidence where the timing was not stable."""

from __future__ import annotations

from collections.abc import Callable

from pitstop.core.profile import TimingSpread


def noisy(spread: TimingSpread | None) -> bool:
    """Whether the timing did not settle (or ran under load); a profile without a spread is taken as it is."""
    return spread is not None and not spread.stable


def ratio_band(point: float, spread: TimingSpread | None) -> tuple[float, float]:
    """The ratio's range: the pairs' quartiles, widened to hold the point (each path's median over the other)."""
    if spread is None:
        return point, point
    return min(point, spread.ratio_low), max(point, spread.ratio_high)


def estimate_band(
    point_ratio: float, spread: TimingSpread | None, estimate: Callable[[float], float]
) -> tuple[float, float]:
    """(low, high) of an estimate computed from the timed ratio by ``estimate`` (monotone in the ratio)."""
    low, high = ratio_band(point_ratio, spread)
    ends = (estimate(low), estimate(high))
    return min(ends), max(ends)


def how_timed(spread: TimingSpread | None, est_low: float, est_high: float) -> str:
    """The clause a basis and a summary carry: stable, or "timed under load / noisy: ×a–×b" and why."""
    if spread is None:
        return ""
    pairs = f"{spread.repeats} interleaved pairs"
    width = (spread.ratio_high - spread.ratio_low) / spread.ratio if spread.ratio > 0 else 0.0
    if spread.stable:
        return f"stable over {pairs} (×{est_low:.2f}–×{est_high:.2f})"
    if spread.under_load:
        busy = (
            f"other processes kept {spread.others_cores:.1f} of the job's {spread.cores} cores busy"
            if spread.others_cores is not None and spread.cores
            else "the machine was busy with other work"
        )
        return f"timed under load ({busy}), noisy: ×{est_low:.2f}–×{est_high:.2f} over {pairs}"
    return (
        f"timed noisy: ×{est_low:.2f}–×{est_high:.2f} (the ratios of {pairs} spread {width:.0%} around their "
        "median)"
    )


def spread_evidence(
    spread: TimingSpread | None, est_low: float, est_high: float, ratio_name: str
) -> dict[str, object]:
    """The evidence of a timing's repeatability: the ratio's quartiles (``ratio_name``), the pairs, whether it
    was stable, the machine's load, and the estimate's range."""
    if spread is None:
        return {}
    return {
        f"{ratio_name}_range": [round(spread.ratio_low, 3), round(spread.ratio_high, 3)],
        "timing_repeats": spread.repeats,
        "timing_stable": spread.stable,
        "timing_under_load": spread.under_load,
        "timing_others_cores": spread.others_cores,
        "timing_load_per_core": spread.load_per_core,
        "est_speedup_range": [round(est_low, 3), round(est_high, 3)],
    }
