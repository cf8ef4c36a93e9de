"""Give every rank the same work and the same host resources, so none holds the others back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, register


@register
class BalanceRanks(Remedy):
    id = RemedyId.BALANCE_RANKS
    title = "balance the ranks"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``slow_rank`` and ``reason``: who holds the others back and why (from the evidence)."""
        slow, reason = params.get("slow_rank"), params.get("reason")
        who = (
            f"Rank {slow} is the slow one" + (f" ({reason})" if reason else "")
            if slow is not None
            else "One rank is slow"
        )
        text = (
            f"{who}. Look at that rank's host first: its data pipeline "
            "(workers per rank), CPU contention or NUMA placement, its GPU's clocks, and give every rank a "
            "similar number of tokens per step (group by length or pack)."
        )
        if params.get("reason") == "compute":
            text = (
                f"{who}. It computes slower than its peers: check its GPU's clocks and temperature, other "
                "processes on it, and whether its batches are longer (group by length or pack so every rank "
                "gets equal work)."
            )
            return Advice(text, "nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER")
        if framework is Framework.TRL:
            return Advice(text, "config = SFTConfig(..., packing=True)")
        if framework is Framework.HF_TRAINER:
            return Advice(text, 'args = TrainingArguments(..., train_sampling_strategy="group_by_length")')
        return Advice(
            text, "loader = DataLoader(train, ..., sampler=DistributedSampler(train), pin_memory=True)"
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.PYTORCH)
