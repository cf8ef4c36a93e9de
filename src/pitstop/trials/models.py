"""Fixes applied to the model and the trainer's arguments, from outside the job's code.

* ``attention``: at the first forward of a Hugging Face model, ``set_attn_implementation`` switches it
  (and its sub-models) to SDPA, or FlashAttention where it is installed and the model is on a GPU.
* ``bf16``: the model's forward runs under bf16 autocast (Trainer: ``bf16=True``).
* ``no_checkpointing``: ``gradient_checkpointing_enable`` / ``activation_checkpointing_enable`` become no-ops (Trainer:
  ``gradient_checkpointing=False``).
* ``micro_batch``: the Trainer's micro-batch grows by the largest factor that divides its gradient
  accumulation, which shrinks by the same factor, so each optimizer step sees the same examples.
* ``tf32``: TF32 matrix math on CUDA.
"""

from __future__ import annotations

import functools
from typing import Any

from pitstop.trials.request import FixReport, FixRequest


def _is_hf_model(module: Any) -> bool:
    return hasattr(module, "set_attn_implementation") and hasattr(module, "config")


def on_first_model_forward(request: FixRequest, report: FixReport) -> None:
    """One global forward pre-hook, done at the first Hugging Face model it sees and removed at the next
    optimizer step (not inside the forward: torch is iterating over the hooks then)."""
    import torch
    from torch.optim import optimizer as optim_mod

    wanted = request.fixes & {"attention", "bf16"}
    if not wanted:
        return
    done = False

    def hook(module: Any, args: Any) -> None:
        nonlocal done
        if done or not _is_hf_model(module):
            return
        done = True
        if "attention" in wanted:
            _switch_attention(module, request.attn_target, report)
        if "bf16" in wanted:
            _autocast_forward(module, report)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)

    def remove(optimizer: Any, args: Any, kwargs: Any) -> None:
        if done:
            handle.remove()

    optim_mod.register_optimizer_step_pre_hook(remove)


def _switch_attention(model: Any, target: str, report: FixReport) -> None:
    before = getattr(model.config, "_attn_implementation", None)
    if before == target:
        report.skip("attention", f"the model already runs {target}")
        return
    try:
        model.set_attn_implementation(target)
    except Exception as exc:
        report.skip("attention", f"{type(model).__name__} cannot switch to {target}: {exc}")
        return
    after = getattr(model.config, "_attn_implementation", None)
    if after == target:
        report.apply("attention", f"{type(model).__name__}: {before} → {target}")
    else:
        report.skip("attention", f"{type(model).__name__} stayed on {after}")


def _autocast_forward(model: Any, report: FixReport) -> None:
    import torch

    device = next((p.device.type for p in model.parameters()), "cpu")
    forward = model.forward

    @functools.wraps(forward)
    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            return forward(*args, **kwargs)

    model.forward = autocast_forward
    report.apply("bf16", f"{type(model).__name__} forward under bf16 autocast ({device})")


def enable_tf32(request: FixRequest, report: FixReport) -> None:
    import torch

    if "tf32" not in request.fixes:
        return
    if not torch.cuda.is_available():
        report.skip("tf32", "no CUDA device")
        return
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    report.apply("tf32", "torch.backends.cuda.matmul.allow_tf32 = True; cudnn.allow_tf32 = True")


def patch_checkpointing(modeling_utils: Any, request: FixRequest, report: FixReport) -> None:
    """``transformers.modeling_utils`` was just imported: checkpointing requests become no-ops."""
    if "no_checkpointing" not in request.fixes:
        return
    model_class = modeling_utils.PreTrainedModel

    for name in ("gradient_checkpointing_enable", "activation_checkpointing_enable"):  # renamed in v5
        if hasattr(model_class, name):

            def skipped(model: Any, *args: Any, _name: str = name, **kwargs: Any) -> None:
                report.apply("no_checkpointing", f"{_name}() on {type(model).__name__} skipped")

            setattr(model_class, name, skipped)


def largest_factor(accumulation: int, limit: int) -> int:
    """The largest k <= limit that divides the accumulation (so micro × k × accumulation / k is unchanged)."""
    return max((k for k in range(1, min(accumulation, limit) + 1) if accumulation % k == 0), default=1)


def patch_training_arguments(training_args: Any, request: FixRequest, report: FixReport) -> None:
    """``transformers.training_args`` was just imported: rewrite the fields before they are validated."""
    cls = training_args.TrainingArguments
    original = cls.__post_init__

    @functools.wraps(original)
    def __post_init__(args: Any) -> None:
        _rewrite(args, request, report)
        original(args)

    cls.__post_init__ = __post_init__


def _rewrite(args: Any, request: FixRequest, report: FixReport) -> None:
    fixes = request.fixes
    if request.scratch is not None:
        report.redirected.append(f"TrainingArguments.output_dir {args.output_dir} → {request.scratch}")
        args.output_dir = str(request.scratch / "trainer_output")
        report.save()
    if "micro_batch" in fixes:
        accumulation = int(args.gradient_accumulation_steps)
        k = largest_factor(accumulation, request.micro_batch_factor)
        if k > 1:
            mb = int(args.per_device_train_batch_size)
            args.per_device_train_batch_size = mb * k
            args.gradient_accumulation_steps = accumulation // k
            report.apply(
                "micro_batch",
                f"per_device_train_batch_size {mb} → {mb * k}, "
                f"gradient_accumulation_steps {accumulation} → {accumulation // k}",
            )
        else:
            report.skip("micro_batch", "no gradient accumulation to trade for a bigger micro-batch")
    if "bf16" in fixes:
        args.bf16, args.fp16 = True, False
        report.apply("bf16", "TrainingArguments(bf16=True)")
    if "no_checkpointing" in fixes:
        for name in ("gradient_checkpointing", "activation_checkpointing"):  # renamed in transformers 5
            if getattr(args, name, False):
                setattr(args, name, False)
                report.apply("no_checkpointing", f"TrainingArguments({name}=False)")
