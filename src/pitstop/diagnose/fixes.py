"""Fix text and snippets, written for the framework the user runs.

Framework ids: ``hf_trainer`` (transformers.Trainer), ``trl`` (SFTTrainer & co.), ``accelerate``,
``lightning``, ``deepspeed`` (a ds_config), ``pytorch`` (a plain loop). Each builder takes the numbers
it needs so the snippet carries concrete values, not placeholders, where they are known.
"""

from __future__ import annotations

from textwrap import dedent

from pitstop.findings import Fix


def _s(text: str) -> str:
    return dedent(text).strip("\n")


def dataloader(framework: str, workers: int, text_in_loop: bool) -> Fix:
    if text_in_loop:
        text = (
            "Tokenize the dataset once, before training (and cache it), instead of in the collate function "
            f"on every step; then load batches in {workers} background workers with pinned memory."
        )
    else:
        text = f"Load batches in {workers} background worker processes, prefetched and pinned, so the next batch is "
        text += "ready when the step ends."
    tokenize = _s("""
        # tokenize once, up front (cached by `datasets` on disk)
        train = raw.map(lambda ex: tokenizer(ex["text"], truncation=True, max_length=2048),
                        batched=True, num_proc=4, remove_columns=raw.column_names)
    """)
    snippets = {
        "hf_trainer": _s(f"""
            args = TrainingArguments(
                ...,
                dataloader_num_workers={workers},
                dataloader_pin_memory=True,
                dataloader_persistent_workers=True,
                dataloader_prefetch_factor=2,
            )
        """),
        "trl": _s(f"""
            config = SFTConfig(
                ...,
                dataset_num_proc={workers},          # tokenization happens once, before training
                dataloader_num_workers={workers},
                dataloader_pin_memory=True,
                dataloader_persistent_workers=True,
            )
        """),
        "pytorch": _s(f"""
            loader = DataLoader(train, batch_size=..., collate_fn=collate,
                                num_workers={workers}, pin_memory=True,
                                persistent_workers=True, prefetch_factor=2)
        """),
    }
    snippets["accelerate"] = snippets["pytorch"]
    snippets["lightning"] = snippets["pytorch"] + "\n# return this loader from train_dataloader()"
    if text_in_loop:
        for key in ("hf_trainer", "pytorch", "accelerate", "lightning"):
            snippets[key] = tokenize + "\n" + snippets[key]
    return Fix(text=text, snippets=snippets, framework=framework)


def padding(framework: str, fixed_length: bool) -> Fix:
    text = (
        "Stop computing on pad tokens: pack several examples into each row (with per-example attention "
        "boundaries), or at least pad each batch only to its longest example and group examples of similar "
        "length."
    )
    if fixed_length:
        text += " Every row is padded to the same fixed length today (padding='max_length')."
    snippets = {
        "hf_trainer": _s("""
            # packing without cross-example attention (needs flash_attention_2 or sdpa with position_ids support)
            from transformers import DataCollatorWithFlattening
            trainer = Trainer(model, args, train_dataset=train, data_collator=DataCollatorWithFlattening())
            # or, keeping padded batches: pad to the longest example and batch similar lengths together
            args = TrainingArguments(..., train_sampling_strategy="group_by_length")
            collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)   # pads to the longest, not max_length
        """),
        "trl": _s("""
            config = SFTConfig(..., packing=True, packing_strategy="bfd", max_length=2048)
            # or padding-free batches with FlashAttention:
            config = SFTConfig(..., padding_free=True,
                               model_init_kwargs={"attn_implementation": "flash_attention_2"})
        """),
        "pytorch": _s("""
            # pad to the longest example of each batch, not to a fixed maximum
            enc = tokenizer(texts, padding="longest", truncation=True, max_length=2048, return_tensors="pt")
            # better: pack examples into full rows and restart position_ids at each example boundary,
            # so attention never crosses examples (FlashAttention varlen / SDPA with a block mask)
        """),
    }
    snippets["accelerate"] = snippets["pytorch"]
    snippets["lightning"] = snippets["pytorch"]
    return Fix(text=text, snippets=snippets, framework=framework)


def attention(framework: str, on_gpu: bool) -> Fix:
    best = "flash_attention_2" if on_gpu else "sdpa"
    text = (
        f"Load the model with a fused attention implementation ('{best}'"
        + ("; 'sdpa' needs no extra package" if on_gpu else "")
        + ") instead of 'eager', which materializes the full attention matrix."
    )
    snippets = {
        "hf_trainer": _s(f"""
            model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="{best}")
            # a model built from a config: AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
        """),
        "trl": _s(f"""
            config = SFTConfig(..., model_init_kwargs={{"attn_implementation": "{best}"}})
        """),
        "pytorch": _s("""
            # replace softmax(q @ k.transpose(-2, -1) * scale) @ v with the fused kernel:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        """),
    }
    snippets["accelerate"] = snippets["hf_trainer"]
    snippets["lightning"] = snippets["hf_trainer"]
    return Fix(text=text, snippets=snippets, framework=framework)


def precision(framework: str, bf16_ok: bool, tf32_only: bool) -> Fix:
    low = "bf16" if bf16_ok else "fp16"
    if tf32_only:
        text = f"Matrix math runs in TF32; train in mixed precision ({low}) for roughly twice the tensor-core rate."
    else:
        text = f"Train in mixed precision ({low}) and allow TF32 for the remaining fp32 matmuls."
    dtype = "torch.bfloat16" if bf16_ok else "torch.float16"
    snippets = {
        "hf_trainer": f"args = TrainingArguments(..., {low}=True, tf32=True)",
        "trl": f"config = SFTConfig(..., {low}=True, tf32=True)",
        "accelerate": f'accelerator = Accelerator(mixed_precision="{low}")',
        "lightning": f'trainer = L.Trainer(..., precision="{low}-mixed")',
        "deepspeed": f'"{low}": {{"enabled": true}}',
        "pytorch": _s(f"""
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            with torch.autocast("cuda", dtype={dtype}):
                loss = model(**batch).loss
            {"scaler = torch.amp.GradScaler()  # fp16 needs loss scaling" if not bf16_ok else ""}
        """).rstrip(),
    }
    return Fix(text=text, snippets=snippets, framework=framework)


def offload(framework: str, fits_without: bool, offloaded: dict[str, str], gpus: int) -> Fix:
    what = " and ".join(f"{k} states to {v}" for k, v in sorted(offloaded.items()))
    if fits_without:
        text = f"The run offloads {what}, but it fits in GPU memory without offload: turn offload off."
    else:
        text = (
            f"The run offloads {what}. Before paying PCIe on every step, make it fit on the GPUs: shard with "
            f"ZeRO-3 across {max(gpus, 2)} GPUs, train LoRA adapters, or use an 8-bit optimizer."
        )
    ds = _s("""
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "none"},
            "offload_param": {"device": "none"}
        }
    """)
    snippets = {
        "deepspeed": ds,
        "hf_trainer": "# in the ds_config.json passed as TrainingArguments(deepspeed=...):\n" + ds,
        "trl": "# in the ds_config.json passed as SFTConfig(deepspeed=...):\n" + ds,
        "accelerate": "# accelerate config: offload_optimizer_device: none, offload_param_device: none",
        "pytorch": "# FSDP: FullyShardedDataParallel(model, cpu_offload=CPUOffload(offload_params=False))",
    }
    if not fits_without:
        snippets["hf_trainer"] += (
            '\n# or: LoRA (peft.LoraConfig(r=16)), or TrainingArguments(optim="adamw_bnb_8bit")'
        )
    return Fix(text=text, snippets=snippets, framework=framework)


def host_sync(framework: str) -> Fix:
    text = (
        "Keep the host ahead of the GPU: do not call .item(), .cpu(), print a tensor or synchronize on every "
        "step. Accumulate metrics on the device and read them every N steps."
    )
    snippets = {
        "hf_trainer": "args = TrainingArguments(..., logging_steps=50)   # each log reads the loss from the GPU",
        "pytorch": _s("""
            running = torch.zeros((), device="cuda")
            for step, batch in enumerate(loader):
                loss = model(**batch).loss
                loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
                running += loss.detach()                 # stays on the GPU: no sync
                if step % 50 == 0:
                    print(running.item() / 50); running.zero_()   # one sync every 50 steps
        """),
    }
    snippets["trl"] = snippets["hf_trainer"].replace("TrainingArguments", "SFTConfig")
    snippets["accelerate"] = snippets["pytorch"]
    snippets["lightning"] = (
        "self.log('loss', loss, on_step=True, sync_dist=False)  # log tensors, not .item()"
    )
    return Fix(text=text, snippets=snippets, framework=framework)


def pinned(framework: str) -> Fix:
    text = (
        "Pin the DataLoader's host memory and copy batches with non_blocking=True so copies overlap compute."
    )
    snippets = {
        "hf_trainer": "args = TrainingArguments(..., dataloader_pin_memory=True)",
        "trl": "config = SFTConfig(..., dataloader_pin_memory=True)",
        "pytorch": _s("""
            loader = DataLoader(train, ..., pin_memory=True)
            batch = {k: v.to("cuda", non_blocking=True) for k, v in batch.items()}
        """),
    }
    snippets["accelerate"] = snippets["pytorch"]
    snippets["lightning"] = snippets["pytorch"]
    return Fix(text=text, snippets=snippets, framework=framework)


def bigger_batch(
    framework: str, micro_batch: int | None, accum: int | None, planned: int | None = None
) -> Fix:
    """``planned`` is the largest micro-batch the planner predicts fits; without it, suggest doubling."""
    mb = micro_batch or 1
    new_mb = mb * 2
    if planned and planned > mb:
        # the largest size that fits and keeps the effective batch a whole number of micro-batches
        effective = mb * (accum or 1)
        new_mb = max(
            (b for b in range(mb + 1, planned + 1) if effective % b == 0), default=min(planned, mb * 2)
        )
    new_accum = max(1, (mb * (accum or 1)) // new_mb)
    limit = f" (`pitstop plan` predicts up to {planned} fits)" if planned else ""
    text = (
        f"Raise the micro-batch (e.g. {mb} → {new_mb}){limit} and lower gradient accumulation in proportion "
        f"({accum or 1} → {new_accum}) so the effective batch stays the same, until memory or throughput stops "
        "improving."
    )
    snippets = {
        "hf_trainer": _s(f"""
            args = TrainingArguments(..., per_device_train_batch_size={new_mb},
                                     gradient_accumulation_steps={new_accum})
            # or let the Trainer search: auto_find_batch_size=True
        """),
        "trl": f"config = SFTConfig(..., per_device_train_batch_size={new_mb}, gradient_accumulation_steps={new_accum})",
        "pytorch": f"loader = DataLoader(train, batch_size={new_mb}, ...)   # and accumulate {new_accum} micro-batches",
        "lightning": f"trainer = L.Trainer(..., accumulate_grad_batches={new_accum})  # DataLoader(batch_size={new_mb})",
        "deepspeed": f'"train_micro_batch_size_per_gpu": {new_mb}, "gradient_accumulation_steps": {new_accum}',
    }
    snippets["accelerate"] = snippets["pytorch"]
    return Fix(text=text, snippets=snippets, framework=framework)


def straggler(framework: str, slow_rank: int, reason: str) -> Fix:
    text = (
        f"Rank {slow_rank} is the slow one ({reason}). Look at that rank's host first: its data pipeline "
        "(workers per rank), CPU contention or NUMA placement, and give every rank a similar number of tokens "
        "per step (group by length or pack)."
    )
    snippets = {
        "hf_trainer": 'args = TrainingArguments(..., dataloader_num_workers=4, train_sampling_strategy="group_by_length")',
        "pytorch": "loader = DataLoader(train, sampler=DistributedSampler(train), num_workers=4, pin_memory=True)",
    }
    snippets["trl"] = "config = SFTConfig(..., packing=True, dataloader_num_workers=4)"
    return Fix(text=text, snippets=snippets, framework=framework)


def low_mfu(framework: str) -> Fix:
    text = (
        "The GPU is busy but does little model math per second. Look at the kernels (a torch.profiler trace): "
        "small or fp32 GEMMs, unfused optimizer and loss, memory-bound elementwise ops. Common wins: a fused "
        "optimizer, torch.compile, fused cross-entropy, a larger micro-batch."
    )
    snippets = {
        "hf_trainer": 'args = TrainingArguments(..., optim="adamw_torch_fused", torch_compile=True)',
        "trl": 'config = SFTConfig(..., optim="adamw_torch_fused", torch_compile=True)',
        "pytorch": _s("""
            opt = torch.optim.AdamW(model.parameters(), lr=..., fused=True)
            model = torch.compile(model)
        """),
        "lightning": "model = torch.compile(model)  # and torch.optim.AdamW(..., fused=True) in configure_optimizers",
    }
    snippets["accelerate"] = snippets["pytorch"]
    return Fix(text=text, snippets=snippets, framework=framework)


def communication(framework: str, zero_stage: int | None) -> Fix:
    text = (
        "Hide gradient communication behind the backward pass: bigger gradient buckets, overlapping "
        "reduce-scatter, fewer and larger collectives; across nodes, check the interconnect first."
    )
    ds = (
        '"zero_optimization": {"overlap_comm": true, "reduce_bucket_size": 5e8, "contiguous_gradients": true}'
    )
    snippets = {
        "pytorch": "model = DDP(model, bucket_cap_mb=100, gradient_as_bucket_view=True, static_graph=True)",
        "hf_trainer": "args = TrainingArguments(..., ddp_bucket_cap_mb=100)  # or overlap_comm in the ds_config",
        "trl": "config = SFTConfig(..., ddp_bucket_cap_mb=100)",
        "deepspeed": ds,
        "accelerate": "DistributedDataParallelKwargs(bucket_cap_mb=100, gradient_as_bucket_view=True)",
        "lightning": "L.Trainer(strategy=DDPStrategy(bucket_cap_mb=100, gradient_as_bucket_view=True))",
    }
    if zero_stage == 3:
        snippets["deepspeed"] = (
            '"zero_optimization": {"stage": 3, "overlap_comm": true, "stage3_prefetch_bucket_size": 5e8}'
        )
    return Fix(text=text, snippets=snippets, framework=framework)


def eval_less_often(framework: str, eval_steps: int | None, save_steps: int | None) -> Fix:
    parts = []
    if eval_steps:
        parts.append(f"evaluate every {max(eval_steps * 5, 100)} steps instead of {eval_steps}")
    if save_steps:
        parts.append(f"save every {max(save_steps * 5, 100)} steps instead of {save_steps}")
    text = (
        "Evaluate and checkpoint less often, and on a smaller evaluation set: "
        + ("; ".join(parts) if parts else "raise eval_steps / save_steps")
        + "."
    )
    eval_to = max((eval_steps or 20) * 5, 100)
    save_to = max((save_steps or 20) * 5, 100)
    snippets = {
        "hf_trainer": f"args = TrainingArguments(..., eval_steps={eval_to}, save_steps={save_to}, "
        "per_device_eval_batch_size=16)",
        "trl": f"config = SFTConfig(..., eval_steps={eval_to}, save_steps={save_to})",
        "pytorch": f"if step % {eval_to} == 0: evaluate()  # and a sampled eval set",
        "lightning": "L.Trainer(..., val_check_interval=1000, limit_val_batches=0.1)",
    }
    return Fix(text=text, snippets=snippets, framework=framework)


def use_every_gpu(framework: str, idle: list[str]) -> Fix:
    text = (
        f"GPU {', '.join(idle)} did no work. Launch one process per GPU (torchrun --nproc_per_node / "
        "accelerate launch --num_processes) and check CUDA_VISIBLE_DEVICES and device placement."
    )
    snippets = {
        "pytorch": "torchrun --nproc_per_node $(nvidia-smi -L | wc -l) train.py",
        "hf_trainer": "accelerate launch --num_processes $(nvidia-smi -L | wc -l) train.py",
    }
    return Fix(text=text, snippets=snippets, framework=framework)
