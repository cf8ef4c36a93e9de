"""Pad each batch only to its longest example, not to a fixed length.

Where the job pads at tokenization (``padding="max_length"``) and its collator pads per batch already (a
``DataCollatorForLanguageModeling`` does), the fix is one argument dropped in the job's own code; the advice
names that line and keeps the job's collator. Replacing a causal-LM job's collator with
``DataCollatorForSeq2Seq`` would break it (rows without labels: "the model did not return a loss"), so the
collator advised follows the one the probe saw. tune measures the same computation from outside the job by
cutting each batch's padding columns (``trials.collate.TrimPadding``) and says so in the change it keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, LoaderParams, Remedy, TrialFacts, code, register
from pitstop.trials.request import FixReport, FixRequest

TOKENIZER_MODULE = "transformers.tokenization_utils_base"
LM_COLLATOR = "DataCollatorForLanguageModeling"  # makes labels from input_ids; pads each batch to its longest
SEQ2SEQ_COLLATOR = "DataCollatorForSeq2Seq"  # pads the rows' own labels with -100; needs labels in the rows
# collators that pad each batch to its longest row by default: padding a row further before them is waste
PER_BATCH_PADDERS = (
    LM_COLLATOR,
    SEQ2SEQ_COLLATOR,
    "DataCollatorWithPadding",
    "DataCollatorForTokenClassification",
)
MEASURED_AS = (
    "tune measured it as trim_padding: each batch cut to its longest row, the same computation as padding "
    "per batch"
)


def collator_name(collate: Any) -> str | None:
    """A collate function's name as the probe records it (``DataLoaderInfo.collate_fn``), the job's own
    collator's where the Trainer wrapped it to drop unused columns."""
    if collate is None:
        return None
    inner = getattr(collate, "data_collator", None)  # the Trainer's RemoveColumnsCollator wraps the job's
    if inner is not None and type(collate).__name__ == "RemoveColumnsCollator":
        collate = inner
    return getattr(collate, "__qualname__", None) or type(collate).__qualname__


def pads_per_batch(collate_fn: str | None) -> bool:
    return bool(collate_fn) and str(collate_fn).rsplit(".", 1)[-1] in PER_BATCH_PADDERS


def _drop_line(params: Mapping[str, Any]) -> str:
    """The job's tokenizer line without ``padding="max_length"`` (or a generic call when it is unknown)."""
    from pitstop.trials.padding_calls import without_padding

    site, changed = params.get("site"), without_padding(params.get("code"))
    if changed is not None:
        return f'# {site}: padding="max_length" dropped\n{changed}'
    length = params.get("padded_to")
    where = f"# {site}: " if site else "# where the job tokenizes: "
    return (
        where + 'drop padding="max_length"\n'
        f"tokenizer(texts, truncation=True, max_length={length or 'max_length'})"
    )


# the job's collate: its rows (token id lists) padded to the batch's longest
PAD_PER_BATCH = (
    'batch = tokenizer.pad([{"input_ids": r} for r in rows], padding="longest", return_tensors="pt")'
)


def _collator_lines(collate_fn: str | None, framework: Framework) -> str:
    """The collator to pad per batch: the job's own when it does already (TRL's SFTTrainer builds one that
    does), else one chosen by whether the rows carry labels (a causal-LM dataset does not:
    DataCollatorForSeq2Seq would leave the model without a loss)."""
    if framework is Framework.TRL and not collate_fn:
        return "trainer = SFTTrainer(...)  # no data_collator: TRL's own pads each batch to its longest row"
    if pads_per_batch(collate_fn):
        name = str(collate_fn).rsplit(".", 1)[-1]
        return f"# keep data_collator={name}(...): it pads each batch to its longest row"
    return code("""
        from transformers import DataCollatorForLanguageModeling
        # rows without labels (causal LM): labels made from input_ids, each batch padded to its longest row;
        # rows with their own labels: DataCollatorForSeq2Seq(tokenizer, padding="longest") pads them with -100
        collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
        trainer = TRAINER(..., data_collator=collator)
    """).replace("TRAINER", framework.trainer_class)


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
        """``padded_by``: "tokenizer" when a tokenizer call of the job pads to ``padded_to`` (``site``,
        ``code``: its line); ``fixed_length``: every row is one width; ``collate_fn``: the job's collator;
        ``measured``: the change tune kept after its trim_padding trial."""
        collate_fn = params.get("collate_fn")
        before_collator = params.get("padded_by") == "tokenizer" or (
            bool(params.get("fixed_length")) and pads_per_batch(collate_fn)
        )
        measured = f" ({MEASURED_AS})." if params.get("measured") else "."
        if before_collator:
            site = params.get("site")
            length = params.get("padded_to")
            text = (
                'Drop padding="max_length" from the tokenizer call'
                + (f" ({site})" if site else " where the job tokenizes")
                + (f": every row is padded to {length} tokens" if length else ": every row is padded")
                + " before the collator, "
                + (
                    "which already pads each batch to its longest row"
                    if pads_per_batch(collate_fn)
                    else "so pad each batch to its longest row in the collator instead"
                )
                + measured
            )
            if framework is Framework.PYTORCH and not pads_per_batch(collate_fn):
                tail = PAD_PER_BATCH + "  # in the collate"
            else:
                tail = _collator_lines(collate_fn, framework)
            return Advice(text, _drop_line(params) + "\n" + tail)
        text = "Pad each batch to its longest example, not to a fixed length"
        text += " (every row is padded to the same length today)" if params.get("fixed_length") else ""
        text += measured
        if framework.is_trainer:
            tokenize = 'tokenize without padding="max_length"'
            if pads_per_batch(collate_fn):
                return Advice(text, _collator_lines(collate_fn, framework) + f"; {tokenize}")
            return Advice(text, _collator_lines(collate_fn, framework) + f"  # and {tokenize}")
        return Advice(
            text,
            PAD_PER_BATCH + '  # not padding="max_length"',
        )

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.HF_TRAINER, Framework.TRL, Framework.PYTORCH)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return None

    def on_import(self) -> Mapping[str, Callable[[ModuleType, FixRequest, FixReport], None]]:
        """Watch the job's tokenizer calls: the kept change names the line that pads to max_length."""

        def watch(module: ModuleType, request: FixRequest, report: FixReport) -> None:
            from pitstop.trials.padding_calls import watch as watch_calls

            watch_calls(module)

        return {TOKENIZER_MODULE: watch}

    def rewrite_loader(self, params: LoaderParams, request: FixRequest, report: FixReport) -> None:
        from pitstop.trials.collate import TrimPadding, wrapped_collate
        from pitstop.trials.padding_calls import seen

        collate = wrapped_collate(params)
        if collate is None:
            return
        found: dict[str, Any] = {"measured": True, "collate_fn": collator_name(collate)}
        params["collate_fn"] = TrimPadding(collate)
        call = seen()
        if call is not None:
            found.update(
                padded_by="tokenizer",
                padded_to=call.pads_to,
                site=call.site,
                code=call.code,
                fixed_length=True,
            )
        report.apply(self.id, "padding columns cut from every right-padded batch", **found)
