"""Fixes applied where a job builds its DataLoaders: worker processes, padding removal, length grouping.

``DataLoader.__init__`` is wrapped once; each requested fix rewrites the constructor's arguments. Loaders
built again from a loader (Accelerate's shards call the constructor with the same collate function and batch
sampler) are recognised and not changed twice.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import Any

from pitstop.trials.collate import PackBatch, TrimPadding
from pitstop.trials.request import FixReport, FixRequest

LOADER_FIXES = ("pack", "pretokenize", "workers", "trim_padding", "pack_batch", "group_by_length")
MAX_GROUPED_EXAMPLES = 2_000_000  # reading every example's length beyond this costs more than a trial


def worker_count() -> int:
    """Enough workers to hide tokenization, leaving cores for the training process itself."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


class EpochGroupedBatchSampler:
    """pitstop's length-grouped batches, a fresh grouping each time the loader starts an epoch."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int, drop_last: bool) -> None:
        from pitstop.data.sampler import LengthGroupedBatchSampler

        self.sampler = LengthGroupedBatchSampler(lengths, batch_size, seed=seed, drop_last=drop_last)
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self) -> Any:
        batches = self.sampler.batches()
        self.sampler.epoch += 1
        return iter(batches)

    def __len__(self) -> int:
        return len(self.sampler)


def example_length(item: Any) -> int | None:
    """Real tokens of one dataset example, or None when it is not token ids."""
    if not isinstance(item, Mapping):
        return None
    mask = item.get("attention_mask")
    if mask is not None:
        return int(sum(mask)) if isinstance(mask, list) else int(mask.sum()) if hasattr(mask, "sum") else None
    ids = item.get("input_ids")
    if ids is None or isinstance(ids, str):
        return None
    return len(ids)


def _grouped(params: dict[str, Any], report: FixReport) -> None:
    import torch
    from torch.utils.data import IterableDataset, RandomSampler, SequentialSampler

    dataset = params["dataset"]
    sampler = params.get("sampler")
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        report.skip("group_by_length", "the dataset is a stream (no lengths to group by)")
        return
    if params.get("batch_sampler") is not None or not params.get("batch_size"):
        if not isinstance(params.get("batch_sampler"), EpochGroupedBatchSampler):
            report.skip("group_by_length", "the loader already has its own batch sampler")
        return
    if sampler is not None and not isinstance(sampler, RandomSampler | SequentialSampler):
        report.skip("group_by_length", f"the loader uses {type(sampler).__name__}, kept as it is")
        return
    n = len(dataset)
    if n > MAX_GROUPED_EXAMPLES:
        report.skip("group_by_length", f"{n:,} examples: group them once with `pitstop data pack`")
        return
    lengths = []
    for i in range(n):
        length = example_length(dataset[i])
        if length is None:
            report.skip("group_by_length", "examples are not token ids (tokenized later, in the collate)")
            return
        lengths.append(length)
    seed = int(torch.initial_seed() % 2**31)
    params["batch_sampler"] = EpochGroupedBatchSampler(
        lengths, int(params["batch_size"]), seed, bool(params.get("drop_last"))
    )
    for key, default in (("batch_size", 1), ("shuffle", None), ("sampler", None), ("drop_last", False)):
        params[key] = default
    report.apply("group_by_length", f"length-grouped batches of {params['batch_sampler'].batch_size}")


def _pretokenize(params: dict[str, Any], report: FixReport) -> None:
    from torch.utils.data import IterableDataset

    from pitstop.probe.batch import looks_like_text
    from pitstop.trials.pretokenize import CachedRows, build_cache

    dataset, collate = params["dataset"], params.get("collate_fn")
    if isinstance(dataset, CachedRows):
        return  # a loader rebuilt from one we already changed
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__") or collate is None:
        report.skip("pretokenize", "no map-style dataset with a tokenizing collate")
        return
    if not len(dataset) or not looks_like_text([dataset[0]]):
        report.skip("pretokenize", "examples are already token ids")
        return
    import torch

    built = build_cache(
        dataset, collate, int(params.get("batch_size") or 1), int(torch.initial_seed() % 2**31)
    )
    if isinstance(built, str):
        report.skip("pretokenize", built)
        return
    params["dataset"], params["collate_fn"], seconds = built
    report.apply(
        "pretokenize", f"{len(dataset):,} examples collated once, in {seconds:.1f} s, before training"
    )


def _same_sampler_over(params: dict[str, Any]) -> None:
    """A new dataset of another length needs its sampler rebuilt: random stays random, in order stays."""
    from torch.utils.data import RandomSampler, SequentialSampler

    sampler = params.get("sampler")
    if isinstance(sampler, RandomSampler):
        params["sampler"] = RandomSampler(params["dataset"], generator=sampler.generator)
    elif isinstance(sampler, SequentialSampler):
        params["sampler"] = SequentialSampler(params["dataset"])


def _pack(params: dict[str, Any], request: FixRequest, report: FixReport) -> None:
    import torch
    from torch.utils.data import IterableDataset, RandomSampler, SequentialSampler, default_collate

    from pitstop.data.collate import PackingCollator
    from pitstop.trials.pretokenize import PackedExamples, build_packed

    dataset = params["dataset"]
    if isinstance(dataset, PackedExamples):
        return
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__") or not len(dataset):
        report.skip("pack", "the dataset is a stream")
        return
    sampler = params.get("sampler")
    if params.get("batch_sampler") is not None or (
        sampler is not None and not isinstance(sampler, RandomSampler | SequentialSampler)
    ):
        report.skip("pack", "the loader has its own sampler, kept as it is")
        return
    collate = params.get("collate_fn") or default_collate
    built = build_packed(
        dataset, collate, int(params.get("batch_size") or 1), int(torch.initial_seed() % 2**31)
    )
    if isinstance(built, str):
        report.skip("pack", built)
        return
    packed, seconds = built
    attn = request.attn_target if "attention" in request.fixes else (request.attn or "sdpa")
    params["dataset"] = packed
    params["collate_fn"] = PackingCollator(attn, pad_token_id=packed.pad_token_id)
    _same_sampler_over(params)
    report.apply(
        "pack",
        f"{len(dataset):,} examples packed into {len(packed):,} rows, in {seconds:.1f} s ({attn} masks)",
    )


def _workers(params: dict[str, Any], report: FixReport) -> None:
    import torch
    from torch.utils.data import IterableDataset

    if isinstance(params["dataset"], IterableDataset):
        report.skip("workers", "the dataset is a stream: each worker would yield all of it")
        return
    workers = max(int(params.get("num_workers") or 0), worker_count())
    params["num_workers"] = workers
    params["persistent_workers"] = True
    params["prefetch_factor"] = max(int(params.get("prefetch_factor") or 0), 4)
    pinned = torch.cuda.is_available()
    params["pin_memory"] = pinned or bool(params.get("pin_memory"))
    report.apply("workers", f"num_workers={workers}, persistent, prefetch 4" + (", pinned" if pinned else ""))


def _collate(params: dict[str, Any], request: FixRequest, report: FixReport) -> None:
    from torch.utils.data import default_collate

    collate = params.get("collate_fn") or default_collate
    if isinstance(collate, TrimPadding | PackBatch):
        return  # a loader rebuilt from a loader we already changed
    if "pack_batch" in request.fixes:
        attn = request.attn or "sdpa"
        if "attention" in request.fixes:
            attn = request.attn_target
        params["collate_fn"] = PackBatch(collate, attn, pad_token_id=0)
        report.apply("pack_batch", f"each batch packed into one padding-free row ({attn} mask)")
    elif "trim_padding" in request.fixes:
        params["collate_fn"] = TrimPadding(collate)
        report.apply("trim_padding", "padding columns cut from every right-padded batch")


def patch_dataloader(request: FixRequest, report: FixReport) -> None:
    import torch.utils.data as tud

    wanted = request.fixes & set(LOADER_FIXES)
    if not wanted:
        return
    original = tud.DataLoader.__init__
    signature = inspect.signature(original)

    def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(loader, *args, **kwargs)
            bound.apply_defaults()
            params = dict(bound.arguments)
            params.pop(next(iter(signature.parameters)))  # the loader itself
        except TypeError:
            original(loader, *args, **kwargs)
            return
        steps: list[tuple[str, Any]] = []
        if "pack" in wanted:
            steps.append(("pack", lambda: _pack(params, request, report)))
        elif "pretokenize" in wanted:
            steps.append(("pretokenize", lambda: _pretokenize(params, report)))
        if "group_by_length" in wanted:
            steps.append(("group_by_length", lambda: _grouped(params, report)))
        if "workers" in wanted:
            steps.append(("workers", lambda: _workers(params, report)))
        for fix in ("pack_batch", "trim_padding"):
            if fix in wanted:
                steps.append((fix, lambda: _collate(params, request, report)))
                break
        for fix, step in steps:
            before = dict(params)
            try:
                step()
            except Exception as exc:  # a fix that cannot handle this loader leaves it as it was
                params.clear()
                params.update(before)
                report.skip(fix, f"could not be applied: {type(exc).__name__}: {exc}")
        original(loader, **params)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    tud.DataLoader.__init__ = __init__  # type: ignore[method-assign,assignment]
