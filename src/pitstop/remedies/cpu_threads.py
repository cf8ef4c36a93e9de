"""Thread counts per process that fit the cores: one share of the cores per rank, the workers' cores kept free."""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.cpus import cores_allowed, local_ranks
from pitstop.remedies.base import Advice, Remedy, TrialFacts, code, register
from pitstop.trials.request import FixReport, FixRequest


def share() -> int:
    """Torch threads for one process of this machine: its share of the allowed cores. DataLoader workers are
    not subtracted: in a trial their load is unknown, and most wait on a full prefetch queue."""
    return max(1, cores_allowed() // local_ranks())


@register
class CpuThreads(Remedy):
    id = RemedyId.CPU_THREADS
    title = "torch threads that fit the cores"
    tune_rank = 140
    effect = "same math, fewer threads per process"
    tunable = True

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``threads``: per process; ``ranks``: processes per machine; ``basis``: how it was counted."""
        threads, ranks, basis = params.get("threads"), params.get("ranks"), params.get("basis")
        n = threads or "N"
        text = (
            (
                f"Give each process {threads} torch thread{'s' if threads != 1 else ''}"
                if threads
                else "Give each process only its share of the cores (cores / processes, minus busy DataLoader workers)"
            )
            + (f" ({basis})" if basis else "")
            + ": set OMP_NUM_THREADS for every launcher and torch.set_num_threads in the job."
        )
        launch = (
            f"OMP_NUM_THREADS={n} torchrun --nproc_per_node={ranks} train.py"
            if ranks and ranks > 1
            else f"OMP_NUM_THREADS={n} python train.py"
        )
        if framework is Framework.LIGHTNING:
            return Advice(
                text,
                code(f"""
                {launch}
                torch.set_num_threads({n})  # before L.Trainer(...).fit
            """),
            )
        if framework.is_trainer or framework in (Framework.ACCELERATE, Framework.DEEPSPEED):
            return Advice(
                text,
                code(f"""
                {launch}  # accelerate launch / deepspeed do not set it
                torch.set_num_threads({n})  # at the top of the script
            """),
            )
        return Advice(
            text,
            code(f"""
            {launch}
            torch.set_num_threads({n})  # at the top of the script
        """),
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.PYTORCH, Framework.HF_TRAINER, Framework.LIGHTNING)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return None

    def on_import(self) -> Mapping[str, Any]:
        return {"torch": self._cap_threads}

    def _cap_threads(self, torch: ModuleType, request: FixRequest, report: FixReport) -> None:
        """Set the share now, and keep the job's own ``set_num_threads`` calls from raising it."""
        threads, ranks = share(), local_ranks()
        original = torch.set_num_threads

        def set_num_threads(n: int) -> None:
            original(min(int(n), threads))

        set_num_threads.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(torch, "set_num_threads", set_num_threads)  # noqa: B010  (a module typed without the attribute)
        original(threads)
        basis = f"{cores_allowed()} cores / {ranks} process{'es' if ranks > 1 else ''}"
        report.apply(self.id, f"torch.set_num_threads({threads})", threads=threads, ranks=ranks, basis=basis)
