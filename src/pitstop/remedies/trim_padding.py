"""Pad each batch only to its longest example, not to a fixed length."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, LoaderParams, Remedy, TrialFacts, code, register
from pitstop.trials.request import FixReport, FixRequest


@register
class TrimPadding(Remedy):
    id = RemedyId.TRIM_PADDING
    title = "cut the padding columns of each batch"
    tune_rank = 40
    effect = "same examples and labelled tokens"
    tunable = True
    loader_order = 40
    changes_batch_shape = True
    exclusive_with = (RemedyId.PACK_BATCH,)

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``fixed_length``: every row is padded to one length today (padding='max_length')."""
        text = "Pad each batch to its longest example, not to a fixed length"
        text += " (every row is padded to the same length today)." if params.get("fixed_length") else "."
        if framework.is_trainer:
            return Advice(
                text,
                code("""
                    from transformers import DataCollatorForSeq2Seq
                    collator = DataCollatorForSeq2Seq(tokenizer, padding="longest")  # pads labels with -100 too
                    trainer = Trainer(..., data_collator=collator)  # and tokenize without padding="max_length"
                """),
            )
        return Advice(
            text,
            'batch = tokenizer.pad(rows, padding="longest", return_tensors="pt")  # not padding="max_length"',
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.PYTORCH)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return None

    def rewrite_loader(self, params: LoaderParams, request: FixRequest, report: FixReport) -> None:
        from pitstop.trials.collate import TrimPadding, wrapped_collate

        collate = wrapped_collate(params)
        if collate is None:
            return
        params["collate_fn"] = TrimPadding(collate)
        report.apply(self.id, "padding columns cut from every right-padded batch")
