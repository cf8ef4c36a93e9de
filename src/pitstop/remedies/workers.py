"""DataLoader worker processes, persistent and prefetching, so the next batch is ready when a step ends."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, LoaderParams, Remedy, TrialFacts, code, register
from pitstop.trials.request import FixReport, FixRequest

PREFETCH = 4  # batches each worker keeps ready


def workers_for(cpus: int | None, processes: int = 1) -> int | None:
    """Workers per training process: the cores each process has, less one for the process itself (1..8).
    None when the cores of the machine that runs the job are unknown (a log read elsewhere)."""
    if not cpus:
        return None
    return max(1, min(8, cpus // max(processes, 1) - 1))


@register
class Workers(Remedy):
    id = RemedyId.WORKERS
    title = "DataLoader worker processes, persistent, prefetching"
    tune_rank = 30
    effect = "same batches"
    tunable = True
    loader_order = 30

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``workers``: how many (None: unknown, the fix says how to choose); ``basis``: where it came from;
        ``pin``: pin host memory (a GPU run)."""
        workers = params.get("workers")
        pin = params.get("pin", True)
        if workers:
            n = str(workers)
            how = f"{workers} background worker processes" + (
                f" ({params['basis']})" if params.get("basis") else ""
            )
        else:
            n = "N"
            how = (
                "background worker processes (N: the CPU cores per training process less one; `nproc` tells)"
            )
        text = f"Load batches in {how}, persistent and prefetched" + (" into pinned memory" if pin else "")
        text += ", so the next batch is ready when the step ends."
        if framework.is_trainer:
            extra = (
                f"dataset_num_proc={n},          # tokenization happens once, before training\n    "
                if (framework is Framework.TRL)
                else ""
            )
            snippet = (
                f"args = {framework.args_class}(\n    ...,\n    {extra}dataloader_num_workers={n},\n"
                f"    dataloader_pin_memory={pin},\n    dataloader_persistent_workers=True,\n"
                f"    dataloader_prefetch_factor={PREFETCH},\n)"
            )
        else:
            snippet = code(f"""
                loader = DataLoader(train, batch_size=..., collate_fn=collate,
                                    num_workers={n}, pin_memory={pin},
                                    persistent_workers=True, prefetch_factor={PREFETCH})
            """)
            if framework is Framework.LIGHTNING:
                snippet += "\n# return this loader from train_dataloader()"
        return Advice(text, snippet)

    def frameworks(self) -> tuple[Framework, ...]:
        return (
            Framework.HF_TRAINER,
            Framework.TRL,
            Framework.PYTORCH,
            Framework.ACCELERATE,
            Framework.LIGHTNING,
        )

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return None

    def rewrite_loader(self, params: LoaderParams, request: FixRequest, report: FixReport) -> None:
        import torch
        from torch.utils.data import IterableDataset

        if isinstance(params["dataset"], IterableDataset):
            report.skip(self.id, "the dataset is a stream: each worker would yield all of it")
            return
        processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        workers = max(int(params.get("num_workers") or 0), workers_for(os.cpu_count(), processes) or 1)
        params["num_workers"] = workers
        params["persistent_workers"] = True
        params["prefetch_factor"] = max(int(params.get("prefetch_factor") or 0), PREFETCH)
        pinned = torch.cuda.is_available()
        params["pin_memory"] = pinned or bool(params.get("pin_memory"))
        report.apply(
            self.id,
            f"num_workers={workers}, persistent, prefetch {PREFETCH}" + (", pinned" if pinned else ""),
            workers=workers,
            pin=params["pin_memory"],
        )
