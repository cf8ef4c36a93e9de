"""Issue 42, items 2, 4 and 5: the padding fix pitstop prints is the one in the job's own code, and the change
tune keeps is printed as it was measured.

A job that pads every example at tokenization (``padding="max_length"``) and hands the rows to a collator that
pads per batch already is told to drop that one argument, at its own line, keeping its collator (never a
``DataCollatorForSeq2Seq`` that leaves a causal-LM model without a loss). tune measures that change as
``trim_padding``; the change it keeps says so. A kept ``pack`` prints the row length the trial used, over the
job's own tokenized rows. In the HTML report each remedy of a finding gets its own Copy block."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from tests.factories import profile, steps

from pitstop.core.findings import Finding
from pitstop.core.profile import DataLoaderInfo
from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.diagnose import diagnose
from pitstop.remedies import advise, remedy, use
from pitstop.trials import padding_calls
from pitstop.trials.request import FixReport, FixRequest
from pitstop.tune.proposals import kept_change

JOB_LINE = (
    'return tokenizer(batch["text"], padding="max_length", truncation=True, max_length=args.max_length)'
)
SITE = "/home/user/newcomer_trainer.py:61"
LM = "DataCollatorForLanguageModeling"


def tokenizer() -> Any:
    """The newcomer job's tokenizer: a word-level one trained here (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [" ".join(f"w{i % 50}" for i in range(k, k + 8 + k % 30)) for k in range(64)]
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[EOS]"]))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]"
    )


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``padding_calls`` watching the real tokenizer class, undone after the test."""
    import transformers.tokenization_utils_base as base

    monkeypatch.setattr(base.PreTrainedTokenizerBase, "__call__", base.PreTrainedTokenizerBase.__call__)
    monkeypatch.setattr(padding_calls, "_seen", [])
    padding_calls.watch(base)
    padding_calls.watch(base)  # once: a second watch (the probe's and the trial's) wraps nothing more
    return base


def padded_row_finding(**loader: Any) -> Finding:
    info = DataLoaderInfo(num_workers=0, batch_size=8, collate_fn=loader.pop("collate_fn", LM), **loader)
    found = [
        f
        for f in diagnose(profile("cpu", steps(real_frac=0.25, row_len=256), dataloader=info)).findings
        if f.cause == "padding_waste"
    ]
    assert found, "no padding finding on rows 75% padding"
    return found[0]


# -- the probe's evidence: who pads, on which line -------------------------------------------------------


def test_the_watch_names_the_jobs_tokenizer_line_and_its_code(watched: Any) -> None:
    tok = tokenizer()
    tok(["w1 w2 w3"], truncation=True, max_length=16)  # no fixed padding: nothing seen
    assert padding_calls.seen() is None
    rows = tok(["w1 w2 w3", "w4"], padding="max_length", truncation=True, max_length=16)  # the job's line
    line = (
        Path(__file__)
        .read_text()
        .splitlines()
        .index(
            '    rows = tok(["w1 w2 w3", "w4"], padding="max_length", truncation=True, max_length=16)  # the job\'s line'
        )
    )
    assert all(len(r) == 16 for r in rows["input_ids"])  # the call is handed on unchanged
    seen = padding_calls.seen()
    assert seen is not None and seen.pads_to == 16
    assert seen.site == f"{__file__}:{line + 1}"
    assert seen.code is not None and seen.code.startswith(
        'rows = tok(["w1 w2 w3", "w4"], padding="max_length"'
    )
    assert padding_calls.without_padding(seen.code) == (
        'rows = tok(["w1 w2 w3", "w4"], truncation=True, max_length=16)  # the job\'s line'
    )


def test_the_probe_collector_writes_the_call_into_the_loader_record(watched: Any) -> None:
    from pitstop.core.profile import Environment, RankProfile, RunProfile
    from pitstop.core.vocabulary import Device, Source
    from pitstop.probe.collectors import COLLECTORS
    from pitstop.probe.collectors.base import ProbeContext
    from pitstop.probe.collectors.tokenizer_padding import TokenizerPaddingCollector

    assert TokenizerPaddingCollector in COLLECTORS  # discovered, not listed
    ctx = ProbeContext(
        config=None,  # type: ignore[arg-type]
        origin=0.0,
        hooks=None,  # type: ignore[arg-type]
        errors=[],
        disable=lambda exc: None,
        step_index=lambda: 1,
    )
    collector = TokenizerPaddingCollector(ctx)
    collector.install()  # transformers' tokenizer module is imported: watched at once
    draft = RankProfile(steps=[], environment=Environment(device=Device.CPU))
    collector.fill(draft)
    assert draft.environment.dataloader.tokenizer_pads_to is None  # nothing padded yet: nothing said
    tokenizer()(["w1 w2"], padding="max_length", max_length=12)
    collector.fill(draft)
    loader = draft.environment.dataloader
    assert loader.tokenizer_pads_to == 12 and (loader.tokenizer_padding_site or "").startswith(__file__)
    assert loader.tokenizer_padding_code == 'tokenizer()(["w1 w2"], padding="max_length", max_length=12)'
    doc = RunProfile(source=Source.DOCTOR, ranks=[draft]).to_dict()
    again = RunProfile.from_dict(json.loads(json.dumps(doc)))  # the record survives the profile's document
    assert again.ranks[0].environment.dataloader.tokenizer_padding_code == loader.tokenizer_padding_code


def test_dropping_the_argument_keeps_the_rest_of_the_line() -> None:
    assert padding_calls.without_padding(JOB_LINE) == (
        'return tokenizer(batch["text"], truncation=True, max_length=args.max_length)'
    )
    first = "enc = tok(padding='max_length', text=t)"
    assert padding_calls.without_padding(first) == "enc = tok(text=t)"
    assert padding_calls.without_padding('tok(t, padding="longest")') is None  # nothing to drop
    assert padding_calls.without_padding(None) is None


# -- the rule: the simplest fix in the job's own code first ------------------------------------------------


def test_tokenizer_padding_seen_puts_the_one_line_change_first_with_the_jobs_line() -> None:
    f = padded_row_finding(
        tokenizer_pads_to=256, tokenizer_padding_site=SITE, tokenizer_padding_code=JOB_LINE
    )
    assert [u.remedy for u in f.fix.uses] == [RemedyId.TRIM_PADDING, RemedyId.PACK, RemedyId.GROUP_BY_LENGTH]
    ev = f.evidence
    assert ev["padded_by"] == "tokenizer" and ev["padded_to"] == 256 and ev["site"] == SITE
    assert ev["collate_fn"] == LM and ev["collator_pads_per_batch"] is True and ev["fixed_row_length"] is True
    assert "every row is padded to 256 tokens" in f.summary and SITE in f.summary
    assert "pads nothing more" in f.summary
    snippet = f.fix.snippets["hf_trainer"]
    first = snippet.splitlines()[:3]
    assert first[0] == f'# {SITE}: padding="max_length" dropped'
    assert first[1] == 'return tokenizer(batch["text"], truncation=True, max_length=args.max_length)'
    assert f"keep data_collator={LM}" in first[2]
    assert f.fix.text.startswith(f'Drop padding="max_length" from the tokenizer call ({SITE})')
    assert f.fix.uses[1].params["max_len"] == 256  # packing into rows as long as the job's


def test_rows_all_one_width_before_a_per_batch_collator_say_so_without_a_line() -> None:
    f = padded_row_finding()
    assert f.fix.uses[0].remedy == RemedyId.TRIM_PADDING
    assert f.evidence["padded_by"] == "before the collator" and "site" not in f.evidence
    assert f.fix.text.startswith('Drop padding="max_length" from the tokenizer call where the job tokenizes')
    assert "max_length=256)" in f.fix.snippets["hf_trainer"]


def test_rows_padded_per_batch_still_put_packing_first() -> None:
    varied = [dataclasses.replace(s, seq_len=200 + 8 * i) for i, s in enumerate(steps(real_frac=0.25))]
    p = profile("cpu", varied, dataloader=DataLoaderInfo(num_workers=0, batch_size=8, collate_fn=LM))
    f = next(f for f in diagnose(p).findings if f.cause == "padding_waste")
    assert f.fix.uses[0].remedy == RemedyId.PACK and "padded_by" not in f.evidence


@pytest.mark.parametrize(
    ("collate_fn", "kept", "advised"),
    [
        (LM, f"keep data_collator={LM}", None),
        ("DataCollatorForSeq2Seq", "keep data_collator=DataCollatorForSeq2Seq", None),
        ("default_data_collator", None, "collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)"),
        (None, None, "collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)"),
    ],
)
def test_the_collator_advised_follows_the_one_the_probe_saw(
    collate_fn: str | None, kept: str | None, advised: str | None
) -> None:
    """Item 5: DataCollatorForSeq2Seq on a causal-LM dataset without labels ends in "The model did not
    return a loss": it is advised as code only where the job uses it already."""
    for params in ({"collate_fn": collate_fn}, {"collate_fn": collate_fn, "padded_by": "tokenizer"}):
        snippet = remedy(RemedyId.TRIM_PADDING).advice(Framework.HF_TRAINER, params).snippet
        code_lines = [line.split("#")[0] for line in snippet.splitlines()]
        if kept:
            assert kept in snippet and "Trainer(" not in snippet  # the job's own collator stays
        else:
            assert advised is not None and any(advised in line for line in code_lines)
            assert sum("Trainer(" in line for line in code_lines) == 1
        assert not any("DataCollatorForSeq2Seq(" in line for line in code_lines)  # only ever in a comment


def test_length_buckets_keeps_a_causal_lm_collator_too() -> None:
    lm = remedy(RemedyId.LENGTH_BUCKETS).advice(Framework.HF_TRAINER, {"collate_fn": LM}).snippet
    assert "DataCollatorForLanguageModeling(tokenizer, mlm=False, pad_to_multiple_of=64)" in lm
    assert not any("DataCollatorForSeq2Seq(" in line.split("#")[0] for line in lm.splitlines())
    s2s = remedy(RemedyId.LENGTH_BUCKETS).advice(
        Framework.HF_TRAINER, {"collate_fn": "DataCollatorForSeq2Seq"}
    )
    assert 'DataCollatorForSeq2Seq(tokenizer, padding="longest", pad_to_multiple_of=64)' in s2s.snippet


# -- the change tune keeps, from recorded trial reports ---------------------------------------------------

# what the trim_padding trial's process wrote (``FixReport.params``) on the newcomer job
TRIM_REPORT = {
    "measured": True,
    "collate_fn": LM,
    "padded_by": "tokenizer",
    "padded_to": 256,
    "site": SITE,
    "code": JOB_LINE,
    "fixed_length": True,
}
# what the pack trial's process wrote: 2,000 examples, the job's own rows, packed into rows of 256
PACK_REPORT = {
    "done": "2,000 examples packed into 523 rows, in 1.4 s (eager masks)",
    "max_len": 256,
    "labels": "input_ids",
    "batch_size": 8,
}


def test_kept_trim_padding_prints_the_dropped_argument_and_says_how_it_was_measured() -> None:
    change = kept_change("trim_padding", "hf_trainer", TRIM_REPORT)
    assert change.text.startswith(f'Drop padding="max_length" from the tokenizer call ({SITE})')
    assert "tune measured it as trim_padding" in change.text
    assert (
        change.snippet.splitlines()[1]
        == 'return tokenizer(batch["text"], truncation=True, max_length=args.max_length)'
    )
    assert "DataCollatorForSeq2Seq" not in change.snippet
    # the document holds the very text printed
    from pitstop.tune.session import Best

    doc = Best(["trim_padding"], 2000.0, 2.0, 0.05, [change], True).to_dict()
    assert doc["changes"] == [{"fix": "trim_padding", "text": change.text, "snippet": change.snippet}]
    assert json.loads(json.dumps(doc))["changes"][0]["snippet"] == change.snippet


def test_kept_pack_prints_the_row_length_used_over_the_jobs_own_rows() -> None:
    for framework in ("hf_trainer", "pytorch"):
        change = kept_change("pack", framework, PACK_REPORT)
        assert "max_len=256" in change.snippet and "2048" not in change.snippet
        assert (
            "build_cache" not in change.snippet
            and ".jsonl" not in change.snippet
            and "tok.json" not in change.snippet
        )
        assert "template" not in change.snippet  # no template (responses-only training) slipped in
        assert "rows of 256 tokens" in change.text and str(PACK_REPORT["done"]) in change.text
    trl = kept_change("pack", "trl", PACK_REPORT)
    assert trl.snippet == 'config = SFTConfig(..., packing=True, packing_strategy="bfd", max_length=256)'
    own = kept_change("pack", "hf_trainer", {**PACK_REPORT, "labels": "own"})
    assert 'r["labels"]' in own.snippet


def test_kept_pack_batch_on_a_dense_mask_prints_what_was_measured() -> None:
    change = kept_change("pack_batch", "hf_trainer", {"attn": "eager", "collate_fn": LM})
    assert "PackBatch(DataCollatorForLanguageModeling(tokenizer, mlm=False)" in change.snippet
    assert "DataCollatorWithFlattening" not in change.snippet  # that one is for flash attention
    flash = kept_change("pack_batch", "hf_trainer", {"attn": "flash_attention_2", "collate_fn": LM})
    assert "DataCollatorWithFlattening" in flash.snippet


# -- the trials report what the kept change is written from ----------------------------------------------


def _lm_rows(tok: Any, width: int = 32) -> Any:
    from datasets import Dataset

    texts = [" ".join(f"w{(i * 7 + j) % 50}" for j in range(3 + i % 20)) for i in range(40)]
    return Dataset.from_dict({"text": texts}).map(
        lambda b: tok(b["text"], padding="max_length", truncation=True, max_length=width),
        batched=True,
        remove_columns=["text"],
    )


def test_the_trim_padding_trial_reports_the_jobs_padding_line(watched: Any) -> None:
    from transformers import DataCollatorForLanguageModeling

    from pitstop.trials.collate import TrimPadding

    tok = tokenizer()
    hooks = remedy(RemedyId.TRIM_PADDING).on_import()
    hooks["transformers.tokenization_utils_base"](watched, FixRequest(), FixReport(None))
    train = _lm_rows(tok)  # the map's tokenizer call pads to max_length
    params: dict[str, Any] = {"dataset": train, "collate_fn": DataCollatorForLanguageModeling(tok, mlm=False)}
    report = FixReport(None)
    remedy(RemedyId.TRIM_PADDING).rewrite_loader(params, FixRequest(), report)
    assert isinstance(params["collate_fn"], TrimPadding)
    got = report.params["trim_padding"]
    assert got["measured"] is True and got["collate_fn"] == LM
    assert got["padded_by"] == "tokenizer" and got["padded_to"] == 32
    assert got["site"].startswith(f"{__file__}:") and 'padding="max_length"' in got["code"]
    batch = params["collate_fn"]([train[i] for i in range(8)])
    assert batch["input_ids"].shape[1] < 32  # the trial measured per-batch padding


def test_the_pack_trial_reports_the_row_length_it_used() -> None:
    from transformers import DataCollatorForLanguageModeling

    tok = tokenizer()
    train = _lm_rows(tok, width=48)
    params: dict[str, Any] = {
        "dataset": train,
        "collate_fn": DataCollatorForLanguageModeling(tok, mlm=False),
        "batch_size": 4,
    }
    report = FixReport(None)
    remedy(RemedyId.PACK).rewrite_loader(params, FixRequest(attn="eager"), report)
    got = report.params["pack"]
    assert got["max_len"] == 48 and got["labels"] == "input_ids" and got["batch_size"] == 4
    assert "40 examples packed into" in got["done"]


# -- the HTML report: one Copy block per remedy ---------------------------------------------------------


def test_each_alternative_has_its_own_copy_block() -> None:
    from pitstop.report.html.run import fix_blocks

    fix = advise(
        "hf_trainer",
        use(RemedyId.TRIM_PADDING, collate_fn="default_data_collator"),
        use(RemedyId.PACK, max_len=256),
        use(RemedyId.GROUP_BY_LENGTH),
    )
    html = fix_blocks(fix, fix.snippet or "")
    blocks = html.split('<div class="snippet">')[1:]
    assert len(blocks) == 3
    for block in blocks:  # no block holds two Trainer(...) lines
        code = block.split("<pre>")[1].split("</pre>")[0]
        assert sum("trainer = Trainer(" in line for line in code.splitlines()) <= 1
    assert [
        b
        for b in ('data-remedy="trim_padding"', 'data-remedy="pack"', 'data-remedy="group_by_length"')
        if b in html
    ] == ['data-remedy="trim_padding"', 'data-remedy="pack"', 'data-remedy="group_by_length"']
    one = advise("hf_trainer", use(RemedyId.PACK, max_len=256))
    assert fix_blocks(one, one.snippet or "").count('<div class="snippet">') == 1
