"""How a probe is told what to do: in-process arguments, or environment variables set by the runner."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pitstop.probe.stopping import WindowRule

ENV_OUT = "PITSTOP_OUT"
ENV_WARMUP = "PITSTOP_WARMUP"
ENV_STEPS = "PITSTOP_STEPS"
ENV_FULL = "PITSTOP_FULL"
ENV_QUIET = "PITSTOP_QUIET"
ENV_PRECISION = "PITSTOP_PRECISION"  # with PITSTOP_STEPS=auto: the window's target precision
ENV_MAX_WINDOW_S = "PITSTOP_MAX_WINDOW_S"  # with PITSTOP_STEPS=auto: the most a window measures, seconds
ENV_MAX_STEPS = "PITSTOP_MAX_STEPS"  # with PITSTOP_STEPS=auto: the most steps a window measures
ENV_FIXED_STEPS = "PITSTOP_FIXED_STEPS"  # with PITSTOP_STEPS=auto: the window of a multi-rank job
ENV_NVML_REPLAY = "PITSTOP_NVML_REPLAY"  # a recorded NVML trace to replay instead of a live GPU (tests)
ENV_RUNNER_PID = (
    "PITSTOP_RUNNER_PID"  # the pitstop process that started the job (its top process dies with it)
)


@dataclass
class ProbeConfig:
    warmup: int = 10
    steps: int | None = 50  # measured optimizer steps; None = until the run ends
    out_dir: Path | None = None  # where the runner collects per-process results
    stop_when_done: bool = False  # end the process once the window is measured (zero-code runner)
    announce: bool = True  # print one-line progress messages on stderr (rank 0 only)
    nvml_replay: Path | None = None
    auto: WindowRule | None = None  # warm-up and window length decided by the steps themselves

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ProbeConfig | None:
        """The config the runner passed down, or None when this process is not being observed."""
        env = os.environ if environ is None else environ
        out = env.get(ENV_OUT)
        if not out:
            return None
        full = env.get(ENV_FULL) == "1"
        auto = None
        if env.get(ENV_STEPS) == "auto":
            max_s = env.get(ENV_MAX_WINDOW_S)
            auto = WindowRule(
                precision=float(env.get(ENV_PRECISION, "0.03")),
                max_seconds=float(max_s) if max_s else None,
                max_steps=int(env.get(ENV_MAX_STEPS, "300")),
            )
        return cls(
            warmup=int(env.get(ENV_WARMUP, "10")),
            steps=None
            if full
            else int(env.get(ENV_FIXED_STEPS, "30"))
            if auto
            else int(env.get(ENV_STEPS, "50")),
            auto=auto,
            out_dir=Path(out),
            stop_when_done=not full,
            announce=env.get(ENV_QUIET) != "1",
            nvml_replay=Path(env[ENV_NVML_REPLAY]) if env.get(ENV_NVML_REPLAY) else None,
        )

    def to_env(self) -> dict[str, str]:
        env = {ENV_WARMUP: str(self.warmup)}
        if self.out_dir is not None:
            env[ENV_OUT] = str(self.out_dir)
        if self.auto is not None:
            env[ENV_STEPS] = "auto"
            env[ENV_PRECISION] = str(self.auto.precision)
            env[ENV_MAX_STEPS] = str(self.auto.max_steps)
            if self.steps is not None:
                env[ENV_FIXED_STEPS] = str(self.steps)
            if self.auto.max_seconds is not None:
                env[ENV_MAX_WINDOW_S] = str(self.auto.max_seconds)
        elif self.steps is None:
            env[ENV_FULL] = "1"
        else:
            env[ENV_STEPS] = str(self.steps)
        if not self.announce:
            env[ENV_QUIET] = "1"
        if self.nvml_replay is not None:
            env[ENV_NVML_REPLAY] = str(self.nvml_replay)
        return env
