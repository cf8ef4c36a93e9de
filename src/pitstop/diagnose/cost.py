"""What the run costs at a price per GPU-hour: per hour and per million real tokens.

Computed once, where a diagnosis gets its savings (``Diagnosis.add_savings``), with the same GPU count the
savings bill (``savings.gpus_paid``): a CPU run pays for no GPU, so it gets no cost per token, and says why.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pitstop.core.profile import RunProfile
from pitstop.diagnose.energy import cost_per_million_tokens
from pitstop.diagnose.metrics import Metrics
from pitstop.diagnose.savings import gpus_paid

NO_GPU = "a CPU run pays for no GPU, so a price per GPU-hour gives it no cost per token"
NO_RATE = "no real-token rate measured, so no cost per token"


@dataclass(frozen=True)
class RunCost:
    """The run's cost figures (the JSON's ``cost``); ``why`` says why a figure is missing."""

    price_per_gpu_hour: float
    gpus: int  # the GPUs the job pays for (0 on a CPU run)
    per_million_real_tokens: float | None
    per_hour: float | None = None  # price × GPUs; None on a CPU run (and in documents written before it)
    why: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_cost(profile: RunProfile, metrics: Metrics, price: float | None) -> RunCost | None:
    """The run's cost at ``price`` per GPU-hour; None without a price."""
    if price is None:
        return None
    gpus = gpus_paid(profile)
    if not gpus:
        return RunCost(price, 0, None, None, NO_GPU)
    per_m = cost_per_million_tokens(price, gpus, metrics.real_tokens_per_s)
    return RunCost(price, gpus, per_m, price * gpus, NO_RATE if per_m is None else None)
