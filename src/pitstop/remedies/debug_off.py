"""Switch the debugging aids off for training runs: anomaly detection, blocking launches, the distributed
debug checks, deterministic algorithms. None changes what the model computes (deterministic algorithms
change only the order of floating-point sums), so a run without them trains the same.

Not tunable yet: a trial could switch each off from outside the job (the environment before torch starts,
``torch.set_anomaly_enabled`` kept off), but that is not wired into tune's trials."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, code, register


@register
class DebugOff(Remedy):
    id = RemedyId.DEBUG_OFF
    title = "debug modes off for training"
    effect = "same training; no anomaly stacks, blocking launches or extra checks"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``anomaly``: anomaly detection was on (``site``: the job's line that switched it on);
        ``settings``: the slow settings seen ("CUDA_LAUNCH_BLOCKING=1", ...)."""
        anomaly = params.get("anomaly", True)
        site = params.get("site")
        settings: list[str] = list(params.get("settings") or [])
        parts = []
        if anomaly:
            where = f" (at {site})" if site else ""
            parts.append(
                "Switch autograd's anomaly detection off for training runs"
                f"{where}: it records a stack for every operation and checks every gradient, every step. "
                "Turn it on again only to find where a NaN starts."
            )
        env = [s.split("=", 1)[0] for s in settings if "=" in s]
        if env:
            parts.append(f"Unset {', '.join(env)} in the job's environment: both are for debugging.")
        if any(s.startswith("torch.use_deterministic_algorithms") for s in settings):
            parts.append(
                "Drop torch.use_deterministic_algorithms(True) unless bit-exact reruns are required."
            )
        if not parts:
            parts.append(
                "Switch the debugging aids off for training runs: anomaly detection, CUDA_LAUNCH_BLOCKING, "
                "TORCH_DISTRIBUTED_DEBUG and deterministic algorithms each slow every step."
            )
        return Advice(" ".join(parts), self._snippet(framework, env))

    def _snippet(self, framework: Framework, env: list[str]) -> str:
        unset = "".join(f"\nunset {name}" for name in env)
        if framework is Framework.LIGHTNING:
            return (
                code("""
                trainer = L.Trainer(..., detect_anomaly=False)   # the default; True runs every step under it
            """)
                + unset
            )
        return (
            code("""
            torch.autograd.set_detect_anomaly(False)   # or remove the set_detect_anomaly / detect_anomaly() call
        """)
            + unset
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.LIGHTNING, Framework.PYTORCH)
