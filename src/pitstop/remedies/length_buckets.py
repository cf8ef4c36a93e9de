"""Pad every batch to one of a few bucket lengths, so torch.compile (or a CUDA graph, or a kernel autotuner) sees
a few shapes instead of a new one nearly every batch.

Padding to the batch's longest example gives as many shapes as there are lengths; a static compile then
compiles again for each (until its recompile limit, then runs eagerly). Rounding each batch up to the next
bucket (powers of two and 1.5 times them: 16, 24, 32, 48, 64, 96, ...) leaves two shapes per doubling of the
length at under 50% more columns, all padding. Every example and labelled token stays, so per-token losses
are the same; the padding columns cost compute, which is why dynamic shapes (``dynamic_compile``) come first.

The trial wraps the job's collate function (``trials.collate.PadToBucket``), after tune's own padding cut
when both are tried: right-padded batches with a 2-D attention mask only; any other batch is left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, LoaderParams, Remedy, TrialFacts, code, register
from pitstop.remedies.trim_padding import SEQ2SEQ_COLLATOR
from pitstop.trials.request import FixReport, FixRequest


@register
class LengthBuckets(Remedy):
    id = RemedyId.LENGTH_BUCKETS
    title = "pad batches to a few bucket lengths"
    tune_rank = 76
    effect = "same examples and labelled tokens, padded to a few lengths"
    tunable = True
    loader_order = 45  # after trim_padding (40): cut to the longest, then round up to the bucket
    changes_batch_shape = True
    exclusive_with = (RemedyId.PACK_BATCH,)
    helps_with = ()

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``multiple``: the step a Trainer's collator pads to (None: 64); ``collate_fn``: the job's collator
        (a ``DataCollatorForSeq2Seq`` is kept: its rows carry labels; any other gets the causal-LM one)."""
        multiple = int(params.get("multiple") or 64)
        text = (
            "Pad each batch to one of a few lengths, not to its own longest example, so the compiled model "
            "sees a few shapes: round the length up to the next bucket (powers of two and 1.5 times them: "
            f"under 50% more columns) or to a multiple of {multiple}."
        )
        if framework is Framework.TRL and not params.get(
            "collate_fn"
        ):  # TRL's own collator takes the multiple
            return Advice(text, f"config = SFTConfig(..., pad_to_multiple_of={multiple})")
        if framework.is_trainer:
            if str(params.get("collate_fn") or "").endswith(SEQ2SEQ_COLLATOR):  # rows with their own labels
                return Advice(
                    text,
                    code(f"""
                        from transformers import DataCollatorForSeq2Seq
                        collator = DataCollatorForSeq2Seq(tokenizer, padding="longest", pad_to_multiple_of={multiple})
                        trainer = TRAINER(..., data_collator=collator)
                    """).replace("TRAINER", framework.trainer_class),
                )
            # a causal-LM dataset has no labels: DataCollatorForSeq2Seq would leave the model without a loss
            return Advice(
                text,
                code(f"""
                    from transformers import DataCollatorForLanguageModeling
                    # rows with their own labels: DataCollatorForSeq2Seq(tokenizer, pad_to_multiple_of={multiple})
                    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False, pad_to_multiple_of={multiple})
                    trainer = TRAINER(..., data_collator=collator)
                """).replace("TRAINER", framework.trainer_class),
            )
        return Advice(
            text,
            code("""
                def bucket(n):  # 16, 24, 32, 48, 64, 96, 128, ...: two lengths per doubling
                    n = max(n, 16)
                    p = 1 << (n - 1).bit_length()
                    return p * 3 // 4 if n <= p * 3 // 4 else p
                length = bucket(max(len(r) for r in rows))   # pad every row of the batch to this length
            """),
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.PYTORCH)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return None

    def rewrite_loader(self, params: LoaderParams, request: FixRequest, report: FixReport) -> None:
        from pitstop.trials.collate import PadToBucket, wrapped_collate

        collate = wrapped_collate(params)
        if collate is None:
            return
        params["collate_fn"] = PadToBucket(collate)
        report.apply(
            self.id, "every right-padded batch padded up to a bucket length (16, 24, 32, 48, 64, ...)"
        )
