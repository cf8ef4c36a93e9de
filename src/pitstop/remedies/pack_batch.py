"""Pack each batch into padding-free rows, attention kept inside each example."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, LoaderParams, Remedy, TrialFacts, code, register
from pitstop.remedies.trim_padding import collator_name
from pitstop.trials.request import FixReport, FixRequest

FLASH_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention")  # pack a batch into one row


def trial_attention(request: FixRequest) -> str:
    """The attention the packed masks are built for: the attention remedy's target when it runs too."""
    if RemedyId.ATTENTION in request.fixes:
        return request.attn_target
    return request.attn or "sdpa"


@register
class PackBatch(Remedy):
    id = RemedyId.PACK_BATCH
    title = "pack each batch into padding-free rows"
    tune_rank = 50
    effect = "same examples per batch; attention kept per example"
    tunable = True
    loader_order = 40
    changes_batch_shape = True
    exclusive_with = (RemedyId.TRIM_PADDING,)

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``attn``: the attention the trial's packed masks were built for; ``collate_fn``: the job's collator
        that the trial packed the output of (what tune measured is that collator's batches, packed)."""
        attn = params.get("attn")
        dense = attn is not None and attn not in FLASH_ATTENTION
        if framework is Framework.TRL and not dense:
            return Advice(
                "Let TRL pack each batch padding-free (it enforces no max_length then: rows truncated when "
                "tokenized, or packing=True to cut them).",
                "config = SFTConfig(..., padding_free=True, max_length=None)  # with flash_attention_2",
            )
        if framework is Framework.HF_TRAINER and not dense:
            return Advice(
                "Pack each batch padding-free (positions restart per example).",
                code("""
                    from transformers import DataCollatorWithFlattening
                    trainer = Trainer(..., data_collator=DataCollatorWithFlattening())  # with flash_attention_2
                """),
            )
        if framework.is_trainer:
            lm = str(params.get("collate_fn") or "").endswith("DataCollatorForLanguageModeling")
            inner = "DataCollatorForLanguageModeling(tokenizer, mlm=False)" if lm else "collate"
            imports = "from transformers import DataCollatorForLanguageModeling\n" if lm else ""
            return Advice(
                f"Pack each batch into padding-free rows no wider than its padded rows ({attn} masks keep "
                "attention inside each example): what tune measured, the job's collator with each of its "
                "batches packed.",
                imports
                + code("""
                    from pitstop.trials.collate import PackBatch
                    collator = PackBatch(INNER, model.config._attn_implementation, tokenizer.pad_token_id)
                    trainer = Trainer(..., data_collator=collator)
                """).replace("INNER", inner)
                + ("" if lm else "  # collate: the job's own data_collator"),
            )
        return Advice(
            "Pack each batch padding-free with pitstop's collator (attention stays inside each example).",
            code("""
                from pitstop.data import PackingCollator
                collate = PackingCollator(model.config._attn_implementation, tokenizer.pad_token_id)
                # rows: {'input_ids', 'labels', 'seq_lens'}; or pre-pack once: pitstop data pack
            """),
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.PYTORCH)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return (
            None if facts.hf_model else "a packed batch needs a model that takes position_ids and 4-D masks"
        )

    def rewrite_loader(self, params: LoaderParams, request: FixRequest, report: FixReport) -> None:
        from pitstop.trials.collate import PackBatch, wrapped_collate

        collate = wrapped_collate(params)
        if collate is None:
            return
        attn = trial_attention(request)
        params["collate_fn"] = PackBatch(collate, attn, pad_token_id=0)
        name = collator_name(collate)
        report.apply(
            self.id, f"each batch packed into padding-free rows ({attn} mask)", attn=attn, collate_fn=name
        )
