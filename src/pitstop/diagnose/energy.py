"""Energy per step and per real token, and what a million real tokens cost.

The driver keeps a cumulative energy counter per GPU (NVML's ``nvmlDeviceGetTotalEnergyConsumption``, DCGM's
``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``, Volta and newer). Where it was read at two or more times, a GPU's
power is its increase over the time between (increases only: a counter that restarted is not a negative
energy). Where it was not, the mean of the sampled power draw stands in, said as an estimate: a power sample
is an average over the driver's own short window, not the energy between samples.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from itertools import pairwise

from pitstop.core.profile import RankProfile, RunProfile
from pitstop.diagnose.gpu_windows import window_samples

COUNTER = "energy counter"
ESTIMATE = "power × time (estimate)"


@dataclass
class Energy:
    power_w: float  # all the run's GPUs together, mean over the sampled time
    gpus: int
    basis: str  # COUNTER when every GPU's figure comes from its counter, else ESTIMATE (said of the first GPU
    # of each process when a process holds several)
    joules_per_step: float | None = None
    joules_per_real_token: float | None = None


def _counter_watts(rank: RankProfile) -> float | None:
    """Mean power from the energy counter's increases over timed samples, or None."""
    act = rank.gpu_activity
    if act is None or not act.timed:
        return None
    read = [(s.t, s.energy_j) for s in act.samples if s.energy_j is not None]
    joules = seconds = 0.0
    for (t0, e0), (t1, e1) in pairwise(read):
        if t1 > t0 and e0 is not None and e1 is not None and e1 >= e0:
            joules += e1 - e0
            seconds += t1 - t0
    return joules / seconds if seconds > 0 else None


def _sampled_watts(rank: RankProfile) -> float | None:
    act = rank.gpu_activity
    drawn = [s.power_w for s in act.samples if s.power_w is not None] if act is not None else []
    drawn = drawn or [s.power_w for s in window_samples(rank) if s.power_w is not None]
    return statistics.fmean(drawn) if drawn else None


def energy_of(profile: RunProfile, step_s: float | None, real_tokens_per_s: float | None) -> Energy | None:
    """The run's GPU power and what it makes per step and per real token; None when no GPU said its power.
    ``step_s`` is the job's step time and ``real_tokens_per_s`` the job's rate (all ranks together)."""
    total, gpus, counted, unsampled = 0.0, 0, True, False
    for rank in profile.ranks:
        watts = _counter_watts(rank)
        if watts is None:
            counted = False
            watts = _sampled_watts(rank)
        if watts is not None:
            # a process reads the GPU it computes on; under a device map the others it holds take turns
            # with it through each step, so each is taken to draw as much
            total += watts * rank.gpus_held
            gpus += rank.gpus_held
            unsampled = unsampled or rank.gpus_held > 1
    if not gpus:
        return None
    basis = COUNTER if counted else ESTIMATE
    if unsampled:
        basis += " of each process's first GPU, its others taken to draw as much"
    return Energy(
        power_w=total,
        gpus=gpus,
        basis=basis,
        joules_per_step=total * step_s if step_s else None,
        joules_per_real_token=total / real_tokens_per_s if real_tokens_per_s else None,
    )


def cost_per_million_tokens(
    price_per_gpu_hour: float, gpus: int, real_tokens_per_s: float | None
) -> float | None:
    """What a million real tokens cost at a price per GPU-hour, every GPU of the job paid for."""
    if not real_tokens_per_s or real_tokens_per_s <= 0:
        return None
    return price_per_gpu_hour * gpus / 3600.0 / real_tokens_per_s * 1e6
