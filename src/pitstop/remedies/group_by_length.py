"""Length-grouped batches: examples of similar length share a batch, so little is padded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, LoaderParams, Remedy, TrialFacts, code, register
from pitstop.trials.request import FixReport, FixRequest

MAX_GROUPED_EXAMPLES = 2_000_000  # reading every example's length beyond this costs more than a trial


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


@register
class GroupByLength(Remedy):
    id = RemedyId.GROUP_BY_LENGTH
    title = "length-grouped batches"
    tune_rank = 70
    effect = "changes which examples share a batch"
    preserves_computation = False
    tunable = True
    loader_order = 20
    changes_batch_shape = True
    helps_with = (RemedyId.TRIM_PADDING,)  # padded to a fixed length, grouping saves nothing until trimmed

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``batch_size``: the job's loader's (a trial's)."""
        text = "Batch examples of similar length together."
        if framework.is_trainer:
            return Advice(
                text, f'args = {framework.args_class}(..., train_sampling_strategy="group_by_length")'
            )
        batch = int(params.get("batch_size") or 8)
        return Advice(
            text,
            code(f"""
                from pitstop.data import LengthGroupedBatchSampler
                lengths = [sum(r["attention_mask"]) for r in dataset]  # each example's real tokens
                batches = LengthGroupedBatchSampler(lengths, batch_size={batch})
                loader = DataLoader(dataset, batch_sampler=batches, collate_fn=collate)  # collate: the job's own
            """),
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.PYTORCH)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return None

    def rewrite_loader(self, params: LoaderParams, request: FixRequest, report: FixReport) -> None:
        import torch
        from torch.utils.data import IterableDataset, RandomSampler, SequentialSampler

        dataset = params["dataset"]
        sampler = params.get("sampler")
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
            report.skip(self.id, "the dataset is a stream (no lengths to group by)")
            return
        if params.get("batch_sampler") is not None or not params.get("batch_size"):
            if not isinstance(params.get("batch_sampler"), EpochGroupedBatchSampler):
                report.skip(self.id, "the loader already has its own batch sampler")
            return
        if sampler is not None and not isinstance(sampler, RandomSampler | SequentialSampler):
            report.skip(self.id, f"the loader uses {type(sampler).__name__}, kept as it is")
            return
        n = len(dataset)
        if n > MAX_GROUPED_EXAMPLES:
            report.skip(self.id, f"{n:,} examples: group them once with `pitstop data pack`")
            return
        lengths = []
        for i in range(n):
            length = example_length(dataset[i])
            if length is None:
                report.skip(self.id, "examples are not token ids (tokenized later, in the collate)")
                return
            lengths.append(length)
        seed = int(torch.initial_seed() % 2**31)
        params["batch_sampler"] = EpochGroupedBatchSampler(
            lengths, int(params["batch_size"]), seed, bool(params.get("drop_last"))
        )
        for key, default in (("batch_size", 1), ("shuffle", None), ("sampler", None), ("drop_last", False)):
            params[key] = default
        size = params["batch_sampler"].batch_size
        report.apply(self.id, f"length-grouped batches of {size}", batch_size=size)
