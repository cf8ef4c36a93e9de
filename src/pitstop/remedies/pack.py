"""Pack whole examples into full rows (best-fit decreasing), positions restarting per example."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, LoaderParams, Remedy, TrialFacts, code, register
from pitstop.remedies.pack_batch import trial_attention
from pitstop.trials.request import FixReport, FixRequest


@register
class Pack(Remedy):
    id = RemedyId.PACK
    title = "pack whole examples into full rows (best-fit decreasing)"
    tune_rank = 60
    effect = "changes which examples share a row and a batch; attention kept per example"
    preserves_computation = False
    tunable = True
    loader_order = 10
    changes_batch_shape = True
    exclusive_with = (
        RemedyId.PRETOKENIZE,
        RemedyId.TRIM_PADDING,
        RemedyId.PACK_BATCH,
        RemedyId.GROUP_BY_LENGTH,
    )

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``done``: what a trial measured doing it (rows, seconds, mask kind)."""
        done = params.get("done")
        text = (
            "Pack whole examples into full rows, with positions restarting and attention kept inside each "
            "example" + (f" ({done})." if done else ".")
        )
        if framework is Framework.TRL:
            return Advice(
                text,
                code("""
                    config = SFTConfig(..., packing=True, packing_strategy="bfd", max_length=2048)
                    # or padding-free batches: SFTConfig(..., padding_free=True) with flash_attention_2
                """),
            )
        head = code("""
            # once: pitstop data cache train.jsonl --tokenizer tok.json --out cache/
            from pitstop.data import PackedDataset, PackingCollator, build_cache
            cache = build_cache("train.jsonl", tokenizer="tok.json", out="cache/")
        """)
        if framework is Framework.HF_TRAINER:
            tail = code("""
                trainer = Trainer(..., train_dataset=PackedDataset(cache, max_len=2048),
                                  data_collator=PackingCollator(model.config._attn_implementation))
            """)
        else:
            tail = code("""
                loader = DataLoader(PackedDataset(cache, max_len=2048), batch_size=8, shuffle=True,
                                    collate_fn=PackingCollator(model.config._attn_implementation))
            """)
        return Advice(text, head + "\n" + tail)

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.PYTORCH)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return (
            None if facts.hf_model else "a packed batch needs a model that takes position_ids and 4-D masks"
        )

    def rewrite_loader(self, params: LoaderParams, request: FixRequest, report: FixReport) -> None:
        import torch
        from torch.utils.data import IterableDataset, RandomSampler, SequentialSampler, default_collate

        from pitstop.data.collate import PackingCollator
        from pitstop.trials.pretokenize import PackedExamples, build_packed

        dataset = params["dataset"]
        if isinstance(dataset, PackedExamples):
            return
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__") or not len(dataset):
            report.skip(self.id, "the dataset is a stream")
            return
        sampler = params.get("sampler")
        if params.get("batch_sampler") is not None or (
            sampler is not None and not isinstance(sampler, RandomSampler | SequentialSampler)
        ):
            report.skip(self.id, "the loader has its own sampler, kept as it is")
            return
        collate = params.get("collate_fn") or default_collate
        built = build_packed(
            dataset, collate, int(params.get("batch_size") or 1), int(torch.initial_seed() % 2**31)
        )
        if isinstance(built, str):
            report.skip(self.id, built)
            return
        packed, seconds = built
        attn = trial_attention(request)
        params["dataset"] = packed
        params["collate_fn"] = PackingCollator(attn, pad_token_id=packed.pad_token_id)
        _same_sampler_over(params)
        done = (
            f"{len(dataset):,} examples packed into {len(packed):,} rows, in {seconds:.1f} s ({attn} masks)"
        )
        report.apply(self.id, done, done=done)


def _same_sampler_over(params: LoaderParams) -> None:
    """A new dataset of another length needs its sampler rebuilt: random stays random, in order stays."""
    from torch.utils.data import RandomSampler, SequentialSampler

    sampler = params.get("sampler")
    if isinstance(sampler, RandomSampler):
        params["sampler"] = RandomSampler(params["dataset"], generator=sampler.generator)
    elif isinstance(sampler, SequentialSampler):
        params["sampler"] = SequentialSampler(params["dataset"])
