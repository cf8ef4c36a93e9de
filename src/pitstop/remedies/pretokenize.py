"""Tokenize every example once, before training, instead of in the collate function on every step."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, LoaderParams, Remedy, TrialFacts, code, register
from pitstop.trials.request import FixReport, FixRequest


@register
class Pretokenize(Remedy):
    id = RemedyId.PRETOKENIZE
    title = "tokenize every example once, before training"
    tune_rank = 20
    effect = "same batches"
    tunable = True
    loader_order = 10

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``done``: what a trial measured doing it (e.g. '1,319 examples collated once, in 2.1 s')."""
        done = params.get("done")
        text = "Tokenize every example once, before training (and cache it), not in the collate function on every step"
        text += f" ({done})." if done else "."
        tokenized = (
            "train = raw.map(tokenize, batched=True, num_proc=8, remove_columns=raw.column_names)  # cached"
        )
        if framework is Framework.TRL:  # SFTTrainer pads the token ids and builds the labels itself
            return Advice(text, f"{tokenized}\ntrainer = SFTTrainer(..., train_dataset=train)")
        if framework.is_trainer:
            # a collator that makes the labels: the tokenized rows of a causal LM carry none (a Seq2Seq
            # collator would pad no labels, and the model would return no loss)
            return Advice(
                text,
                code(f"""
                    from transformers import DataCollatorForLanguageModeling
                    {tokenized}
                    trainer = Trainer(..., train_dataset=train,
                                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
                    # rows with their own labels (the prompt masked): DataCollatorForSeq2Seq(tokenizer, padding="longest")
                """),
            )
        return Advice(
            text,
            code("""
                # once, for every run: pitstop data cache train.jsonl --tokenizer tok.json --out cache/
                from pitstop.data import CachedExamples, build_cache
                cache = build_cache("train.jsonl", tokenizer="tok.json", out="cache/")
                loader = DataLoader(CachedExamples(cache), batch_size=8, collate_fn=collate)  # your collate, now it only pads
            """),
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.PYTORCH)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return "examples are already token ids" if facts.examples_are_text is False else None

    def rewrite_loader(self, params: LoaderParams, request: FixRequest, report: FixReport) -> None:
        import torch
        from torch.utils.data import IterableDataset

        from pitstop.data.rawtext import looks_like_text
        from pitstop.trials.pretokenize import CachedRows, build_cache

        dataset, collate = params["dataset"], params.get("collate_fn")
        if isinstance(dataset, CachedRows):
            return  # a loader rebuilt from one we already changed
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__") or collate is None:
            report.skip(self.id, "no map-style dataset with a tokenizing collate")
            return
        if not len(dataset) or not looks_like_text([dataset[0]]):
            report.skip(self.id, "examples are already token ids")
            return
        built = build_cache(
            dataset, collate, int(params.get("batch_size") or 1), int(torch.initial_seed() % 2**31)
        )
        if isinstance(built, str):
            report.skip(self.id, built)
            return
        params["dataset"], params["collate_fn"], seconds = built
        done = f"{len(dataset):,} examples collated once, in {seconds:.1f} s, before training"
        report.apply(self.id, done, done=done)
