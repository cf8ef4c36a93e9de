"""A throttled GPU: restore its power limit and cooling, or leave it out of the job."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, code, register


@register
class UnthrottleGpu(Remedy):
    id = RemedyId.UNTHROTTLE_GPU
    title = "unthrottle the GPU"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``reasons``: NVML's names of what held the clock back; ``rank``: whose GPU; ``many``: a multi-GPU job."""
        reasons = [str(r) for r in params.get("reasons") or []]
        thermal = any("thermal" in r for r in reasons)
        power = any("power" in r for r in reasons)
        hardware = any(r.startswith("HW") for r in reasons)
        steps = []
        if power or not reasons:
            steps.append("check the power limit against the default (nvidia-smi -q -d POWER) and restore it")
        if thermal or not reasons:
            steps.append("check temperatures and airflow (nvidia-smi -q -d TEMPERATURE)")
        if hardware:
            steps.append(
                "a hardware slowdown points at the power supply or the board: ask the machine's operator"
            )
        if params.get("many"):
            steps.append("or leave the throttled GPU out of the job (CUDA_VISIBLE_DEVICES) until it is fixed")
        rank = params.get("rank")
        text = (
            f"The GPU{f' of rank {rank}' if rank is not None else ''} cannot hold its clock"
            + (f" ({', '.join(reasons)})" if reasons else "")
            + ": "
            + "; ".join(steps)
            + ". This is the machine, not the training code."
        )
        return Advice(
            text,
            code("""
                nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE   # the active clock-event reasons
                sudo nvidia-smi -pl <default power limit>         # when the limit was lowered
            """),
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.PYTORCH,)
