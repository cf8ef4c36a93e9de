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
        """``max_len``: the row length (a trial's, or the job's padded width); ``done``: what a trial measured
        doing it (examples, rows, seconds, masks); ``labels``: "own" when the job's rows carry labels other
        than their input ids; ``batch_size``: the job's loader's."""
        done = params.get("done")
        max_len = params.get("max_len")
        length = str(max_len) if max_len else "<the job's row length>"
        text = (
            "Pack whole examples into full rows, with positions restarting and attention kept inside each "
            "example"
            + (f" ({done})" if done else "")
            + (
                f": the job's own tokenized rows, padding dropped, packed into rows of {max_len} tokens"
                if max_len
                else ""
            )
            + "."
        )
        if framework is Framework.TRL:
            return Advice(
                text
                + " TRL packs with its own padding-free collator (pass no data_collator) and keeps the packed "
                "examples apart by their position_ids.",
                f'config = SFTConfig(..., packing=True, packing_strategy="bfd", max_length={length})',
            )
        own = params.get("labels") == "own"
        rows = code("""
            from pitstop.data import PackingCollator, plan_packing

            # train: the tokenized dataset the job trains on; padding dropped, packed best-fit decreasing
            rows = [[t for t, m in zip(r["input_ids"], r["attention_mask"]) if m] for r in train]
        """)
        if own:
            rows += (
                "\n" + 'labels = [[y for y, m in zip(r["labels"], r["attention_mask"]) if m] for r in train]'
            )
        label_item = ', "labels": [y for j in row for y in labels[j]]' if own else ""
        rows += "\n" + code(f"""
            packed = [
                {{"input_ids": [t for j in row for t in rows[j]]{label_item}, "seq_lens": [len(rows[j]) for j in row]}}
                for row in plan_packing([len(r) for r in rows], max_len={length}).bins
            ]
            collator = PackingCollator(model.config._attn_implementation, tokenizer.pad_token_id)
        """)
        if framework.is_trainer:
            tail = code("""
                args = TrainingArguments(..., remove_unused_columns=False)  # the collator reads seq_lens
                trainer = Trainer(..., args=args, train_dataset=packed, data_collator=collator)
            """)
        else:
            batch = params.get("batch_size") or 8
            tail = f"loader = DataLoader(packed, batch_size={batch}, shuffle=True, collate_fn=collator)"
        return Advice(text, rows + "\n" + tail)

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
        own = any(not torch.equal(i, y) for i, y in zip(packed.ids, packed.labels, strict=True))
        report.apply(
            self.id,
            done,
            done=done,
            max_len=int(packed.max_len),
            labels="own" if own else "input_ids",
            batch_size=int(params.get("batch_size") or 1),
        )


def _same_sampler_over(params: LoaderParams) -> None:
    """A new dataset of another length needs its sampler rebuilt: random stays random, in order stays."""
    from torch.utils.data import RandomSampler, SequentialSampler

    sampler = params.get("sampler")
    if isinstance(sampler, RandomSampler):
        params["sampler"] = RandomSampler(params["dataset"], generator=sampler.generator)
    elif isinstance(sampler, SequentialSampler):
        params["sampler"] = SequentialSampler(params["dataset"])
