"""What the run is: device, framework, model shape, dtypes, attention, DataLoader, offload, ranks.

Read once, at the end of the first optimizer step (inside the warm-up, so its cost is never measured),
from the objects the run already made: the optimizer, the model that owns its parameters, the trainer
on the call stack, the DataLoader. Nothing here initializes CUDA or changes a setting.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any

from pitstop.core.profile import DataLoaderInfo, Environment, ModelInfo, word
from pitstop.core.vocabulary import Device, Sharding
from pitstop.ds_config import hpz_from_deepspeed, offload_from_deepspeed

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
    "xformers",
    "liger_kernel",
)


def dtype_name(dtype: Any) -> str | None:
    return None if dtype is None else _DTYPE_NAMES.get(str(dtype), str(dtype).replace("torch.", ""))


def optimizer_params(optimizer: Any) -> list[Any]:
    return [p for group in getattr(optimizer, "param_groups", []) for p in group.get("params", [])]


def _numel(p: Any) -> int:
    """The parameter's real element count, whatever holds it.

    ZeRO-3 partitioned parameters keep an empty local tensor and the real count in ``ds_numel``;
    bitsandbytes 4-bit weights (``Params4bit``) pack two values per byte of their storage dtype, so
    ``numel()`` is 1 / (2 · itemsize) of the real count, which is what transformers' ``num_parameters``
    corrects for in the same way.
    """
    ds = getattr(p, "ds_numel", None)
    if ds:
        return int(ds)
    if type(p).__name__ == "Params4bit":
        return int(p.numel()) * 2 * int(p.element_size())
    return int(p.numel())


def _fsdp1_flat_params(model: Any) -> list[Any]:
    """FSDP1 ``FlatParameter``s under ``model``: after the first step its parameters are local shards."""
    found: dict[int, Any] = {}
    for module in model.modules():
        flat = getattr(getattr(module, "_handle", None), "flat_param", None)
        if flat is not None and hasattr(flat, "_numels"):
            found[id(flat)] = flat
    return list(found.values())


def _clean_name(name: str) -> str:
    for wrapper in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.", "module."):
        name = name.replace(wrapper, "")
    return name


def _fsdp1_counts(flats: list[Any]) -> tuple[int, int, dict[str, int]]:
    """(total, trainable, numel by parameter name) of the unsharded model from FSDP1's own bookkeeping."""
    total = trainable = 0
    by_name: dict[str, int] = {}
    for flat in flats:
        numels = [int(n) for n in flat._numels]
        originals = getattr(flat, "_params", None)  # use_orig_params=True keeps each one's requires_grad
        grads = [p.requires_grad for p in originals] if originals else [flat.requires_grad] * len(numels)
        for name, n, grad in zip(getattr(flat, "_fqns", [""] * len(numels)), numels, grads, strict=False):
            total += n
            trainable += n if grad else 0
            by_name[_clean_name(name)] = n
    return total, trainable, by_name


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
    """Every live module. ``type(obj)`` rather than ``isinstance``: a ``weakref.proxy`` forwards
    ``__class__`` to its referent, so ``isinstance`` on a dead one raises ReferenceError and on a
    live one yields a proxy whose ``id`` is not the module's."""
    import torch

    module_type = torch.nn.Module
    for obj in gc.get_objects():
        if issubclass(type(obj), module_type):
            yield obj


def find_model(optimizer: Any, trainer: Any = None) -> Any:
    """The top-level module whose parameters the optimizer trains.

    An offloaded optimizer (DeepSpeed's CPU Adam, a hand-written master-weights loop) steps fp32 copies
    that no module holds: then the model is the root module off the CPU with the most trainable parameters.
    """
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
    if best is None:
        sizes = [
            (sum(_numel(p) for p in m.parameters() if p.requires_grad and p.device.type != "cpu"), i)
            for i, m in enumerate(roots)
        ]
        size, index = max(sizes, default=(0, -1))
        best = roots[index] if size else None
    return best


def _has_config(module: Any) -> bool:
    return getattr(module, "config", None) is not None and hasattr(module.config, "to_dict")


def wrapped_inside(module: Any) -> Any:
    """The module a DDP / FSDP / DeepSpeed (``.module``) or torch.compile (``._orig_mod``) wrapper holds; None
    for any other. Tested with ``is not None``: a compiled module refuses ``bool()`` (its ``__len__`` raises)."""
    inner = getattr(module, "module", None)
    return inner if inner is not None else getattr(module, "_orig_mod", None)


def unwrap(model: Any) -> Any:
    """The model with a config inside DDP / DeepSpeed / FSDP / compile / PEFT wrappers, or inside the
    user's own ``nn.Module`` that holds a Hugging Face model (the outermost one found); else ``model``."""
    seen, outer = 0, model
    while model is not None and seen < 6:
        if _has_config(model):
            return model
        inner = wrapped_inside(model)
        if inner is None:
            break
        model, seen = inner, seen + 1
    named = getattr(outer, "named_modules", None)
    if callable(named):
        with contextlib.suppress(Exception):
            for _, module in named():
                if _has_config(module):
                    return module
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
    flats = _fsdp1_flat_params(model)
    by_name: dict[str, int] = {}
    if flats:  # FSDP1 registers its local shard as the parameters: count the unsharded model instead
        info.params_total, info.params_trainable, by_name = _fsdp1_counts(flats)
    info.params_embedding = _embedding_params(core, by_name)
    cfg = getattr(core, "config", None)
    if cfg is not None:
        info.library = (
            "transformers"
            if type(core).__module__.startswith("transformers")
            or any(c.__name__ == "PreTrainedModel" for c in type(core).__mro__)
            else None
        )
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
        info.n_experts = get("num_local_experts", "num_experts", "n_routed_experts")
        if info.n_experts:
            info.experts_active = get("num_experts_per_tok", "moe_topk", "top_k") or 1
            info.params_inactive = _inactive_expert_params(core, info.n_experts, info.experts_active)
    return info


def _inactive_expert_params(model: Any, experts: int, active: int) -> int | None:
    """Expert weights a token skips: (E - k) / E of every parameter under a module named ``experts``."""
    seen: set[int] = set()
    total = 0
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] != "experts":
            continue
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += _numel(p)
    return total * (experts - min(active, experts)) // experts if total else None


def _embedding_params(model: Any, by_name: dict[str, int] | None = None) -> int | None:
    """Input embedding (and learned position) parameters; ``by_name`` gives unsharded counts (FSDP1)."""
    import torch

    by_name = by_name or {}

    def count(name: str, module: Any) -> int:
        key = _clean_name(f"{name}.weight" if name else "weight")
        hits = [n for k, n in by_name.items() if key.endswith(k) or k.endswith(key)]
        return hits[0] if hits else _numel(module.weight)

    get_in = getattr(model, "get_input_embeddings", None)
    if callable(get_in):
        try:
            emb = get_in()
            if emb is not None:
                total = 0
                for name, module in model.named_modules():  # + learned absolute positions (GPT-2 style)
                    if module is emb or (isinstance(module, torch.nn.Embedding) and "pos" in name):
                        total += count(name, module)
                return total
        except Exception:
            pass
    total = sum(count(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Embedding))
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
    """What a Hugging Face model's config asks for; None for other models (see ``uses_torch_attention``)."""
    core = unwrap(model)
    cfg = getattr(core, "config", None)
    impl = getattr(cfg, "_attn_implementation", None) if cfg is not None else None
    return str(impl) if impl else None


def uses_torch_attention(model: Any) -> bool:
    """Whether the model attends with torch's own ``nn.MultiheadAttention`` (alone or inside
    ``nn.Transformer`` / ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer``). Read once, at the
    first step: one pass over the modules, nothing per step."""
    import torch

    modules = getattr(unwrap(model), "modules", None)
    if not callable(modules):
        return False
    return any(isinstance(m, torch.nn.MultiheadAttention) for m in modules())


def torch_attention_path(sdpa_calls: int) -> str:
    """Which path ``nn.MultiheadAttention`` ran in training, from the SDPA calls the window saw. In training
    (grad on) it never takes its fused inference fast path: ``F.multi_head_attention_forward`` calls
    ``scaled_dot_product_attention`` when the caller passes ``need_weights=False`` (as ``nn.Transformer``'s
    layers do), and otherwise computes the score matrix with matmuls and a softmax (the unfused path)."""
    if sdpa_calls:
        return "sdpa (nn.MultiheadAttention)"
    return "eager (nn.MultiheadAttention with need_weights=True)"


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


def _model_tensors(model: Any, params: list[Any]) -> Iterator[Any]:
    """The model's parameters and buffers (when the model is known), then the optimizer's parameters."""
    import itertools

    tensors: Iterator[Any] = iter(())
    if model is not None:
        tensors = itertools.chain(model.parameters(), model.buffers())
    return itertools.chain(tensors, params)


def compute_device(model: Any, params: list[Any]) -> Any:
    """The device the model computes on: the first accelerator holding its parameters or buffers.

    Not the optimizer's: under ZeRO-Offload or FSDP CPU offload the optimizer steps fp32 partitions on
    the CPU while forward and backward run on the GPU. The optimizer's device is the answer only when
    the model is unknown or holds nothing on an accelerator.
    """
    import torch

    first = None
    for t in _model_tensors(model, params):
        device = t.device
        if device.type not in ("cpu", "meta"):
            index = device.index if device.index is not None else _current(device)
            return device if index is None else torch.device(device.type, index)
        first = first or device
    trained = next((p.device for p in params if p.requires_grad), None)
    return trained or first


def gpus_held(model: Any, params: list[Any]) -> int | None:
    """How many accelerators the model's parameters and buffers lie on: more than one when a single process
    spreads the model over several GPUs (a ``device_map``, a hand-made pipeline), each of which the job pays
    for. None when nothing lies on an accelerator."""
    held = set()
    for t in _model_tensors(model, params):
        device = t.device
        if device.type not in ("cpu", "meta"):
            held.add((device.type, device.index if device.index is not None else _current(device)))
    return len(held) or None


def _current(device: Any) -> int | None:
    import torch

    if device.type == "cuda":
        return int(torch.cuda.current_device())
    return None


def device_facts(device: Any, env: Environment) -> None:
    """Device kind, GPU name, memory and count of the device the model computes on (``compute_device``)."""
    import torch

    if device is None:
        return
    env.device = word(Device, device.type)  # "xpu", "meta" ...: kept as the word torch says
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        env.gpu_name = torch.cuda.get_device_name(index)  # "... MIG 1g.10gb" on a MIG slice
        env.gpu_memory_bytes = int(props.total_memory)  # the slice's own memory under MIG
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
            env.zero_hpz = hpz_from_deepspeed(ds_config)
    fsdp = getattr(getattr(accelerator, "state", None), "fsdp_plugin", None)
    if fsdp is not None:
        env.fsdp_sharding = fsdp_strategy(fsdp)
    cpu_offload = getattr(fsdp, "cpu_offload", None)
    if cpu_offload is not None and getattr(cpu_offload, "offload_params", False):
        env.offload = {**(env.offload or {}), "param": "cpu", "optimizer": "cpu"}
    params = optimizer_params(optimizer)
    if env.device == Device.CUDA and params and all(p.device.type == "cpu" for p in params[:8]):
        env.offload = {**(env.offload or {}), "optimizer": (env.offload or {}).get("optimizer", "cpu")}
    if env.offload is None and ds_config is None and fsdp is None:
        env.offload = {}


def fsdp_strategy(plugin: Any) -> str | None:
    """Accelerate's FSDP plugin's sharding: FSDP1's ``sharding_strategy`` enum, or FSDP2's
    ``reshard_after_forward`` (True: FULL_SHARD, False: SHARD_GRAD_OP)."""
    reshard = getattr(plugin, "reshard_after_forward", None)
    if getattr(plugin, "fsdp_version", 1) == 2 and isinstance(reshard, bool):
        return str(Sharding.FULL_SHARD if reshard else Sharding.SHARD_GRAD_OP)
    strategy = getattr(plugin, "sharding_strategy", None)
    found = Sharding.parse(getattr(strategy, "name", strategy))
    return None if found is None else str(found)


def trainer_settings(trainer: Any, env: Environment) -> None:
    args = getattr(trainer, "args", None)
    if args is None:
        return
    env.micro_batch_size = getattr(args, "per_device_train_batch_size", None)
    env.grad_accum_steps = getattr(args, "gradient_accumulation_steps", None)
    env.empty_cache_steps = _count(getattr(args, "torch_empty_cache_steps", None))


def _count(value: Any) -> int | None:
    """A positive whole step count, else None (-1, inf and NaN say "no limit" or "unknown")."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not (value == value and value < 2**62 and value.is_integer()):
        return None
    return int(value) if value > 0 else None


def run_length(trainer: Any, env: Environment) -> None:
    """How many optimizer steps the run is meant to take and how many it had done before this process's
    first step, as its trainer says (read at the end of the probe's step 1, before the trainer counts it).
    A plain loop says nothing: the length stays unknown unless the user gives it (``--total-steps``)."""
    state = getattr(trainer, "state", None)
    args = getattr(trainer, "args", None)
    with contextlib.suppress(Exception):
        if state is not None and args is not None and _count(getattr(state, "max_steps", None)):
            env.total_steps = _count(state.max_steps)
            by_steps = _count(getattr(args, "max_steps", None)) is not None
            env.total_steps_from = (
                "the Trainer's max_steps" if by_steps else "the Trainer's num_train_epochs × steps per epoch"
            )
            env.step_offset = _count(getattr(state, "global_step", None)) or 0
            return
        if trainer is not None and hasattr(trainer, "estimated_stepping_batches"):  # Lightning
            steps = _count(getattr(trainer, "max_steps", None))
            env.total_steps = _count(trainer.estimated_stepping_batches) or steps  # whichever limit ends it
            if env.total_steps:
                env.total_steps_from = (
                    "Lightning's max_steps"
                    if steps == env.total_steps
                    else "Lightning's max_epochs × batches per epoch"
                )
                env.step_offset = _count(getattr(trainer, "global_step", None)) or 0


def versions() -> dict[str, str]:
    found = {}
    for name in _VERSIONED:
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None) if module is not None else None
        if module is not None and not version:  # liger_kernel has no __version__: its distribution says
            with contextlib.suppress(Exception):
                version = importlib.metadata.version(name.replace("_", "-"))
        if version:
            found[name] = str(version)
    return found


def base_environment() -> Environment:
    return Environment(cpu_count=os.cpu_count(), hostname=socket.gethostname(), versions=versions())
