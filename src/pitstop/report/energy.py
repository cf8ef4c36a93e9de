"""The run's energy and cost in words, the same for the terminal, HTML and notebook reports.

Only words: the figures come from the diagnosis (``Metrics``' energy, ``Diagnosis.cost``). Nothing is said
where nothing was measured: a run without a GPU power reading has no energy line, one without a price no
cost line.
"""

from __future__ import annotations

from pitstop.diagnose.cost import RunCost
from pitstop.diagnose.metrics import Metrics


def energy_line(metrics: Metrics) -> str | None:
    """'GPUs draw 1,300 W together · 130 J per step · 0.0079 J per real token (from the energy counter)'."""
    if metrics.gpu_power_w is None:
        return None
    parts = [f"GPUs draw {metrics.gpu_power_w:,.0f} W together"]
    if metrics.joules_per_step is not None:
        parts.append(f"{metrics.joules_per_step:,.0f} J per step")
    if metrics.joules_per_real_token is not None:
        parts.append(f"{metrics.joules_per_real_token:.3g} J per real token")
    return f"{' · '.join(parts)} (from the {metrics.energy_basis or 'power samples'})"


def cost_line(cost: RunCost | None) -> str | None:
    """'$0.025 per million real tokens · $3.6 an hour (1 GPU at $3.6 per GPU-hour)', or why there is none."""
    if cost is None:
        return None
    price = f"${cost.price_per_gpu_hour:g} per GPU-hour"
    if cost.per_million_real_tokens is None:
        return f"{cost.why or 'no cost per token'} (at {price})"
    paid = f"{cost.gpus} GPU{'s' if cost.gpus != 1 else ''} at {price}"
    hour = f" · ${cost.per_hour:,.4g} an hour" if cost.per_hour is not None else ""
    return f"${cost.per_million_real_tokens:,.4g} per million real tokens{hour} ({paid})"
