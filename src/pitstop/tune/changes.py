"""The exact change that makes a kept fix permanent, in the framework the job runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Change:
    fix: str
    text: str
    snippet: str


def change_for(fix: str, framework: str | None, detail: str | None, attn_target: str = "sdpa") -> Change:
    """``detail`` is what the trial process reported it changed (e.g. the new micro-batch)."""
    fw = framework or "pytorch"
    trainer = fw in ("hf_trainer", "trl")
    config = "SFTConfig" if fw == "trl" else "TrainingArguments"
    if fix == "attention":
        return Change(
            fix,
            f"Load the model with attn_implementation={attn_target!r}.",
            f'model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="{attn_target}")\n'
            f'# or, on a model you already have: model.set_attn_implementation("{attn_target}")',
        )
    if fix == "pretokenize":
        if trainer:
            return Change(
                fix,
                "Tokenize the dataset once, before training, not in the collate.",
                "train = train.map(tokenize, batched=True, num_proc=8)  # datasets caches the result\n"
                "trainer = Trainer(..., train_dataset=train,\n"
                '                  data_collator=DataCollatorForSeq2Seq(tokenizer, padding="longest"))',
            )
        return Change(
            fix,
            "Tokenize every example once, before training ("
            + (detail or "cached")
            + "), not in the collate.",
            "# once, for every run: pitstop data cache train.jsonl --tokenizer tok.json --out cache/\n"
            "from pitstop.data import CachedExamples, build_cache\n"
            'cache = build_cache("train.jsonl", tokenizer="tok.json", out="cache/")\n'
            "loader = DataLoader(CachedExamples(cache), batch_size=8, collate_fn=pad_batch)  "
            "# token ids: your collate only pads",
        )
    if fix == "workers":
        if trainer:
            return Change(
                fix,
                "Let the Trainer load batches in worker processes.",
                f"args = {config}(..., dataloader_num_workers=4, dataloader_persistent_workers=True,\n"
                "                 dataloader_prefetch_factor=4, dataloader_pin_memory=True)",
            )
        return Change(
            fix,
            "Build batches in DataLoader worker processes (" + (detail or "num_workers=4") + ").",
            "loader = DataLoader(dataset, ..., num_workers=4, persistent_workers=True, prefetch_factor=4,\n"
            "                    pin_memory=True)",
        )
    if fix == "trim_padding":
        if trainer:
            return Change(
                fix,
                "Pad each batch to its longest example, not to a fixed length.",
                "from transformers import DataCollatorForSeq2Seq\n"
                'collator = DataCollatorForSeq2Seq(tokenizer, padding="longest")  # pads labels with -100 too\n'
                "trainer = Trainer(..., data_collator=collator)  # and tokenize without padding='max_length'",
            )
        return Change(
            fix,
            "Pad each batch to its longest example, not to a fixed length.",
            'batch = tokenizer.pad(rows, padding="longest", return_tensors="pt")  # not padding="max_length"',
        )
    if fix == "pack_batch":
        if fw == "trl":
            return Change(fix, "Let TRL pack padding-free.", "config = SFTConfig(..., padding_free=True)")
        if trainer:
            return Change(
                fix,
                "Pack each batch padding-free (positions restart per example).",
                "from transformers import DataCollatorWithFlattening\n"
                "trainer = Trainer(..., data_collator=DataCollatorWithFlattening())  "
                "# with attn_implementation='flash_attention_2'",
            )
        return Change(
            fix,
            "Pack examples padding-free with pitstop's collator (attention stays inside each example).",
            "from pitstop.data import PackingCollator\n"
            "collate = PackingCollator(model.config._attn_implementation, tokenizer.pad_token_id)\n"
            "# rows: {'input_ids', 'labels', 'seq_lens'}; or pre-pack once: pitstop data pack",
        )
    if fix == "pack":
        if fw == "trl":
            return Change(
                fix, "Let TRL pack whole examples into full rows.", "config = SFTConfig(..., packing=True)"
            )
        return Change(
            fix,
            "Tokenize once and pack whole examples into full rows; positions restart and attention stays "
            "inside each example" + (f" ({detail})." if detail else "."),
            "# once: pitstop data cache train.jsonl --tokenizer tok.json --out cache/\n"
            "from pitstop.data import PackedDataset, PackingCollator, build_cache\n"
            'cache = build_cache("train.jsonl", tokenizer="tok.json", out="cache/")\n'
            + (
                "trainer = Trainer(..., train_dataset=PackedDataset(cache, max_len=2048),\n"
                "                  data_collator=PackingCollator(model.config._attn_implementation))"
                if trainer
                else "loader = DataLoader(PackedDataset(cache, max_len=2048), batch_size=8, shuffle=True,\n"
                "                    collate_fn=PackingCollator(model.config._attn_implementation))"
            ),
        )
    if fix == "group_by_length":
        if trainer:
            return Change(
                fix,
                "Batch examples of similar length together.",
                f'args = {config}(..., train_sampling_strategy="group_by_length")',
            )
        return Change(
            fix,
            "Batch examples of similar length together.",
            "from pitstop.data import LengthGroupedBatchSampler\n"
            "loader = DataLoader(dataset, batch_sampler=LengthGroupedBatchSampler(lengths, batch_size=8))",
        )
    if fix == "micro_batch":
        return Change(
            fix,
            "Raise the micro-batch and lower gradient accumulation by the same factor"
            + (f" ({detail})." if detail else "."),
            f"args = {config}(..., "
            + (_micro_args(detail) if detail else "per_device_train_batch_size=…")
            + ")",
        )
    if fix == "tf32":
        return Change(
            fix,
            "Allow TF32 matrix math.",
            f"args = {config}(..., tf32=True)"
            if trainer
            else "torch.backends.cuda.matmul.allow_tf32 = True\ntorch.backends.cudnn.allow_tf32 = True",
        )
    if fix == "bf16":
        return Change(
            fix,
            "Train in bf16 mixed precision.",
            f"args = {config}(..., bf16=True)"
            if trainer
            else 'with torch.autocast("cuda", dtype=torch.bfloat16):\n    loss = model(**batch).loss',
        )
    if fix == "no_checkpointing":
        return Change(
            fix,
            "Turn activation checkpointing off: memory allows it.",
            f"args = {config}(..., activation_checkpointing=False)  # gradient_checkpointing before 5.0"
            if trainer
            else "# remove model.gradient_checkpointing_enable() (activation_checkpointing_enable() in transformers 5)",
        )
    raise KeyError(fix)


def _micro_args(detail: str) -> str:
    """'per_device_train_batch_size 2 → 8, gradient_accumulation_steps 4 → 1' → the new arguments."""
    parts = []
    for piece in detail.split(","):
        name, _, values = piece.strip().partition(" ")
        parts.append(f"{name}={values.split('→')[-1].strip()}")
    return ", ".join(parts)
