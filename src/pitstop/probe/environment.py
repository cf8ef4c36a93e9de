"""What the run is: device, framework, model shape, dtypes, attention, DataLoader, offload, ranks.

Read once, at the end of the first optimizer step (inside the warm-up, so its cost is never measured),
from the objects the run already made: the optimizer, the model that owns its parameters, the trainer
on the call stack, the DataLoader. Nothing here initializes CUDA or changes a setting.
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any

from pitstop.ds_config import offload_from_deepspeed
from pitstop.profile import DataLoaderInfo, Environment, ModelInfo

_DTYPE_NAMES = {
    "torch.bfloat16": "bf16",
    "torch.float16": "fp16",
    "torch.float32": "fp32",
    "torch.float64": "fp64",
}
_VERSIONED = (
    "torch",
    "transformers",
    "accelerate",
    "trl",
    "peft",
    "deepspeed",
    "lightning",
    "pytorch_lightning",
    "flash_attn",
    "bitsandbytes",
)


def dtype_name(dtype: Any) -> str | None:
    return None if dtype is None else _DTYPE_NAMES.get(str(dtype), str(dtype).replace("torch.", ""))


def optimizer_params(optimizer: Any) -> list[Any]:
    return [p for group in getattr(optimizer, "param_groups", []) for p in group.get("params", [])]


def _numel(p: Any) -> int:
    """Element count, including ZeRO-3 partitioned parameters (whose local tensor is empty)."""
    return int(getattr(p, "ds_numel", None) or p.numel())


# -- finding the trainer and the model ----------------------------------------------------------------
def trainer_on_stack() -> tuple[str, Any]:
    """The framework driving this optimizer step and its trainer object, read off the call stack.

    Precedence: Lightning, then TRL / HF Trainer, then Accelerate, then DeepSpeed, else plain PyTorch.
    """
    frame: Any = sys._getframe(1)
    seen: set[str] = set()
    trainer = None
    while frame is not None:
        module = frame.f_globals.get("__name__", "") or ""
        this = frame.f_locals.get("self")
        top = module.split(".", 1)[0]
        seen.add(top)
        if top in ("lightning", "pytorch_lightning") and trainer is None:
            trainer = _lightning_trainer(this)
        elif module.startswith("transformers.trainer") and this is not None and hasattr(this, "args"):
            return ("trl" if type(this).__module__.startswith("trl") else "hf_trainer"), this
        frame = frame.f_back
    for framework, modules in (
        ("lightning", ("lightning", "pytorch_lightning")),
        ("accelerate", ("accelerate",)),
        ("deepspeed", ("deepspeed",)),
    ):
        if seen.intersection(modules):
            return framework, trainer
    return "pytorch", None


def framework_of(trainer: Any) -> str | None:
    """The framework id of a trainer object handed to the probe by a callback."""
    top = type(trainer).__module__.split(".", 1)[0]
    return {
        "trl": "trl",
        "transformers": "hf_trainer",
        "lightning": "lightning",
        "pytorch_lightning": "lightning",
    }.get(top)


def _lightning_trainer(obj: Any) -> Any:
    for candidate in (obj, getattr(obj, "trainer", None)):
        if candidate is not None and type(candidate).__name__ == "Trainer" and hasattr(candidate, "strategy"):
            return candidate
    return None


def _all_modules() -> Iterator[Any]:
    import torch

    for obj in gc.get_objects():
        if isinstance(obj, torch.nn.Module):
            yield obj


def find_model(optimizer: Any, trainer: Any = None) -> Any:
    """The top-level module whose parameters the optimizer trains."""
    model = getattr(trainer, "model", None) if trainer is not None else None
    if model is not None:
        return model
    params = optimizer_params(optimizer)
    wanted = {id(p) for p in params}
    if not wanted:
        return None
    modules = list(_all_modules())
    children = {id(c) for m in modules for c in m.children()}
    roots = [m for m in modules if id(m) not in children]
    best, best_hits = None, 0
    for m in roots:
        hits = sum(1 for p in m.parameters() if id(p) in wanted)
        if hits > best_hits:
            best, best_hits = m, hits
    return best


def unwrap(model: Any) -> Any:
    """Look through DDP / DeepSpeed / FSDP / compile wrappers to the model with a config."""
    seen = 0
    while model is not None and seen < 6:
        if getattr(model, "config", None) is not None and hasattr(model.config, "to_dict"):
            return model
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model, seen = inner, seen + 1
    return model


# -- model facts --------------------------------------------------------------------------------------
def model_info(model: Any, optimizer: Any) -> ModelInfo:
    info = ModelInfo()
    params = optimizer_params(optimizer)
    if model is None:
        info.params_trainable = sum(_numel(p) for p in params if p.requires_grad) or None
        return info
    unique = {id(p): p for p in model.parameters()}.values()
    info.params_total = sum(_numel(p) for p in unique)
    info.params_trainable = sum(_numel(p) for p in unique if p.requires_grad)
    core = unwrap(model)
    embeddings = _embedding_params(core)
    info.params_embedding = embeddings
    cfg = getattr(core, "config", None)
    if cfg is not None:
        text_cfg = getattr(cfg, "text_config", None) or cfg
        get = lambda *names: next((getattr(text_cfg, n) for n in names if getattr(text_cfg, n, None)), None)  # noqa: E731
        info.model_type = getattr(cfg, "model_type", None)
        info.n_layers = get("num_hidden_layers", "n_layer", "num_layers")
        info.hidden_size = get("hidden_size", "n_embd", "d_model")
        info.n_heads = get("num_attention_heads", "n_head")
        info.head_dim = get("head_dim") or (
            info.hidden_size // info.n_heads if info.hidden_size and info.n_heads else None
        )
        info.vocab_size = get("vocab_size")
        info.intermediate_size = get("intermediate_size", "n_inner")
        info.n_kv_heads = get("num_key_value_heads") or info.n_heads
        info.tied_embeddings = _tied(core, cfg)
    return info


def _embedding_params(model: Any) -> int | None:
    import torch

    get_in = getattr(model, "get_input_embeddings", None)
    if callable(get_in):
        try:
            emb = get_in()
            if emb is not None:
                total = _numel(emb.weight)
                for name, module in model.named_modules():  # learned absolute positions (GPT-2 style)
                    if isinstance(module, torch.nn.Embedding) and module is not emb and "pos" in name:
                        total += _numel(module.weight)
                return total
        except Exception:
            pass
    total = sum(_numel(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding))
    return total or None


def _tied(model: Any, cfg: Any) -> bool | None:
    try:
        out, inp = model.get_output_embeddings(), model.get_input_embeddings()
        if out is not None and inp is not None:
            return out.weight is inp.weight
    except Exception:
        pass
    return getattr(cfg, "tie_word_embeddings", None)


def majority_dtype(params: list[Any]) -> str | None:
    by_dtype: dict[str, int] = {}
    for p in params:
        name = dtype_name(p.dtype) or "?"
        by_dtype[name] = by_dtype.get(name, 0) + _numel(p)
    return max(by_dtype, key=lambda k: by_dtype[k]) if by_dtype else None


def attention_implementation(model: Any) -> str | None:
    core = unwrap(model)
    cfg = getattr(core, "config", None)
    impl = getattr(cfg, "_attn_implementation", None) if cfg is not None else None
    return str(impl) if impl else None


def gradient_checkpointing(model: Any, trainer: Any) -> bool | None:
    core = unwrap(model)
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        flag = getattr(core, name, None)
        if isinstance(flag, bool):
            return flag
    args = getattr(trainer, "args", None)
    return getattr(args, "gradient_checkpointing", None) if args is not None else None


# -- device, precision ----------------------------------------------------------------------------------
def tf32_enabled() -> bool | None:
    import torch

    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)
    if precision in ("tf32", "ieee"):
        return precision == "tf32"
    try:
        return bool(matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest"
    except Exception:
        return None


def device_facts(params: list[Any], env: Environment) -> None:
    import torch

    device = next((p.device for p in params if p.requires_grad), None)
    if device is None:
        return
    env.device = "cuda" if device.type == "cuda" else device.type
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        env.gpu_name = torch.cuda.get_device_name(index)
        env.gpu_memory_bytes = int(props.total_memory)
        env.gpu_count = torch.cuda.device_count()
        env.tf32 = tf32_enabled()


# -- data pipeline --------------------------------------------------------------------------------------
def dataloader_info(loader: Any) -> DataLoaderInfo:
    info = DataLoaderInfo()
    if loader is None:
        return info
    info.num_workers = getattr(loader, "num_workers", None)
    info.pin_memory = getattr(loader, "pin_memory", None)
    info.persistent_workers = getattr(loader, "persistent_workers", None)
    info.prefetch_factor = getattr(loader, "prefetch_factor", None) if info.num_workers else None
    info.batch_size = getattr(loader, "batch_size", None)
    if info.batch_size is None:
        sampler = getattr(loader, "batch_sampler", None)
        info.batch_size = getattr(sampler, "batch_size", None)
    collate = getattr(loader, "collate_fn", None)
    if collate is not None:
        info.collate_fn = getattr(collate, "__qualname__", None) or type(collate).__qualname__
    dataset = getattr(loader, "dataset", None)
    if dataset is not None:
        info.dataset = type(dataset).__qualname__
    return info


# -- distributed, offload -------------------------------------------------------------------------------
def world(env: Environment) -> tuple[int, int]:
    """(rank, local_rank) and env.world_size from torch.distributed, else the launcher's variables."""
    rank, local_rank, world_size = 0, 0, 1
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    rank = int(os.environ.get("RANK", rank))
    local_rank = int(os.environ.get("LOCAL_RANK", local_rank))
    world_size = int(os.environ.get("WORLD_SIZE", world_size))
    env.world_size = world_size
    return rank, local_rank


def offload_and_zero(trainer: Any, optimizer: Any, env: Environment) -> None:
    """ZeRO stage and offload devices from DeepSpeed / Accelerate / FSDP objects, when the run has them."""
    ds_config = None
    args = getattr(trainer, "args", None)
    if args is not None and getattr(args, "deepspeed", None):
        ds_config = args.deepspeed
    accelerator = getattr(trainer, "accelerator", None)
    plugin = getattr(getattr(accelerator, "state", None), "deepspeed_plugin", None)
    if ds_config is None and plugin is not None:
        ds_config = getattr(plugin, "deepspeed_config", None)
    if ds_config is None and "deepspeed" in sys.modules:
        for obj in gc.get_objects():
            if type(obj).__name__ == "DeepSpeedEngine" and hasattr(obj, "config"):
                ds_config = obj.config
                break
    if ds_config is not None:
        with contextlib.suppress(OSError, ValueError):
            env.zero_stage, env.offload = offload_from_deepspeed(ds_config)
    fsdp = getattr(getattr(accelerator, "state", None), "fsdp_plugin", None)
    cpu_offload = getattr(fsdp, "cpu_offload", None)
    if cpu_offload is not None and getattr(cpu_offload, "offload_params", False):
        env.offload = {**(env.offload or {}), "param": "cpu", "optimizer": "cpu"}
    params = optimizer_params(optimizer)
    if env.device == "cuda" and params and all(p.device.type == "cpu" for p in params[:8]):
        env.offload = {**(env.offload or {}), "optimizer": (env.offload or {}).get("optimizer", "cpu")}
    if env.offload is None and ds_config is None and fsdp is None:
        env.offload = {}


def trainer_settings(trainer: Any, env: Environment) -> None:
    args = getattr(trainer, "args", None)
    if args is None:
        return
    env.micro_batch_size = getattr(args, "per_device_train_batch_size", None)
    env.grad_accum_steps = getattr(args, "gradient_accumulation_steps", None)


def versions() -> dict[str, str]:
    found = {}
    for name in _VERSIONED:
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None) if module is not None else None
        if version:
            found[name] = str(version)
    return found


def base_environment() -> Environment:
    return Environment(cpu_count=os.cpu_count(), hostname=socket.gethostname(), versions=versions())
