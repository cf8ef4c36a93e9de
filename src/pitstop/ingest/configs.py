"""Training configurations into Environment facts: TrainingArguments / SFTConfig (JSON or YAML), axolotl,
LLaMA-Factory and Accelerate YAML, DeepSpeed JSON.

Each reader fills only what its file states; "auto" and missing keys stay None, so a later source (or a
measurement) can still say. Relative paths inside a config (a DeepSpeed file named by axolotl) are looked up
beside the config and among the other files given.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.artifacts import IngestError, read_text
from pitstop.core.profile import Environment
from pitstop.core.vocabulary import Sharding
from pitstop.ds_config import hpz_from_deepspeed, offload_from_deepspeed
from pitstop.ingest.documents import load_document

AXOLOTL_KEYS = {"base_model", "sample_packing", "micro_batch_size", "sequence_len", "adapter", "datasets"}
LLAMA_FACTORY_KEYS = {"stage", "finetuning_type", "template", "cutoff_len", "dataset_dir", "flash_attn"}
ACCELERATE_KEYS = {
    "compute_environment",
    "distributed_type",
    "mixed_precision",
    "num_processes",
    "machine_rank",
}
HF_ARGS_KEYS = {
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "output_dir",
    "dataloader_num_workers",
    "num_train_epochs",
    "max_steps",
    "logging_steps",
}
DEEPSPEED_KEYS = {
    "zero_optimization",
    "train_micro_batch_size_per_gpu",
    "train_batch_size",
    "gradient_clipping",
    "zero_allow_untested_optimizer",
    "steps_per_print",
    "wall_clock_breakdown",
}

ATTENTION_NAMES = {
    "flash_attention_2": "flash_attention_2",
    "flash_attention_3": "flash_attention_3",
    "fa2": "flash_attention_2",
    "fa3": "flash_attention_3",
    "sdpa": "sdpa",
    "eager": "eager",
    "disabled": "eager",
    "flex_attention": "flex",
}


@dataclass
class ConfigFacts:
    kind: str
    env: Environment
    notes: list[str] = field(default_factory=list)
    lora: bool | None = None
    quantized: bool | None = None


def config_kind(data: Any) -> str | None:
    """Which kind of training config a parsed JSON / YAML document is, from its keys."""
    if not isinstance(data, dict):
        return None
    keys = set(data)
    if keys & DEEPSPEED_KEYS and not keys & HF_ARGS_KEYS - {"gradient_accumulation_steps"}:
        return "deepspeed"
    if len(keys & ACCELERATE_KEYS) >= 2:
        return "accelerate"
    if len(keys & AXOLOTL_KEYS) >= 2:
        return "axolotl"
    if len(keys & LLAMA_FACTORY_KEYS) >= 2:
        return "llama_factory"
    if len(keys & HF_ARGS_KEYS) >= 2:
        return "hf_args"
    return None


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
        return value.lower() in ("true", "yes")
    return None  # "auto", None, numbers: not a statement


MAX_COUNT = 2**31  # no batch, step count, sequence length or worker count is larger


def _int(value: Any, minimum: int = 1) -> int | None:
    """A count in [minimum, MAX_COUNT], else None: 0, negative, huge, fractional or non-numeric values say
    nothing a rule can use (0 is allowed where it means something, e.g. dataloader_num_workers)."""
    number: int | None = None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and re.fullmatch(r"\s*\d{1,12}\s*", value, re.ASCII):
        number = int(value.strip())
    if number is None or not minimum <= number <= MAX_COUNT:
        return None
    return number


COUNT_KEYS = (  # the keys read as counts (HF writes max_steps: -1 and local_rank: -1; those are not read)
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "dataloader_num_workers",
    "dataloader_prefetch_factor",
    "max_length",
    "max_seq_length",
    "cutoff_len",
    "eval_steps",
    "save_steps",
    "logging_steps",
    "train_micro_batch_size_per_gpu",
    "num_processes",
    "micro_batch_size",
    "sequence_len",
)


def _out_of_range(data: dict[str, Any]) -> list[str]:
    """Count keys holding a number no count can be (negative, or beyond MAX_COUNT), for the report's notes."""
    return [
        key
        for key in COUNT_KEYS
        if isinstance(value := data.get(key), int | float)
        and not isinstance(value, bool)
        and not 0 <= value <= MAX_COUNT
    ]


def _precision(env: Environment, data: dict[str, Any]) -> None:
    bf16, fp16 = _bool(data.get("bf16")), _bool(data.get("fp16"))
    if bf16:
        env.autocast_dtype = "bf16"
    elif fp16:
        env.autocast_dtype = "fp16"
    elif bf16 is False and fp16 is False:
        env.param_dtype = env.param_dtype or "fp32"
    tf32 = _bool(data.get("tf32"))
    if tf32 is not None:
        env.tf32 = tf32


def _common_trainer_keys(env: Environment, data: dict[str, Any]) -> None:
    """Keys that TrainingArguments, SFTConfig and LLaMA-Factory share."""
    env.micro_batch_size = _int(data.get("per_device_train_batch_size"))
    env.grad_accum_steps = _int(data.get("gradient_accumulation_steps"))
    env.gradient_checkpointing = _bool(data.get("gradient_checkpointing"))
    env.dataloader.num_workers = _int(data.get("dataloader_num_workers"), minimum=0)
    env.dataloader.pin_memory = _bool(data.get("dataloader_pin_memory"))
    env.dataloader.persistent_workers = _bool(data.get("dataloader_persistent_workers"))
    env.dataloader.prefetch_factor = _int(data.get("dataloader_prefetch_factor"))
    env.group_by_length = _bool(data.get("group_by_length"))
    if data.get("train_sampling_strategy") == "group_by_length":
        env.group_by_length = True
    env.packing = _bool(data.get("packing"))
    if _bool(data.get("padding_free")):
        env.packing = True
    env.max_seq_len = _int(data.get("max_length") or data.get("max_seq_length") or data.get("cutoff_len"))
    strategy = str(data.get("eval_strategy") or data.get("evaluation_strategy") or "").lower()
    env.eval_steps = None if strategy == "no" else _int(data.get("eval_steps"))
    save_strategy = str(data.get("save_strategy") or "").lower()
    env.save_steps = None if save_strategy == "no" else _int(data.get("save_steps"))
    env.logging_steps = _int(data.get("logging_steps"))
    env.torch_compile = _bool(data.get("torch_compile"))
    env.total_steps = _int(data.get("max_steps"))  # -1 (train by epochs) is not read: no steps per epoch here
    env.total_steps_from = "max_steps in the training config" if env.total_steps else None
    impl = data.get("attn_implementation")
    init = data.get("model_init_kwargs")
    if impl is None and isinstance(init, dict):
        impl = init.get("attn_implementation")
    if isinstance(impl, str) and impl.lower() in ATTENTION_NAMES:
        env.attention.implementation = ATTENTION_NAMES[impl.lower()]
    _precision(env, data)


DS_LIMIT = 2**20  # a DeepSpeed config is a few KB


def _offload(data: Any) -> tuple[int | None, dict[str, str]]:
    try:
        return offload_from_deepspeed(data)
    except ValueError:  # a stage such as "²" that looks like a digit and is not one
        return None, {}


def _zero(env: Environment, data: Any) -> None:
    """A DeepSpeed config's ZeRO facts: stage, offload, ZeRO++ hpZ."""
    env.zero_stage, env.offload = _offload(data)
    try:
        env.zero_hpz = hpz_from_deepspeed(data)
    except ValueError:
        env.zero_hpz = None


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def _deepspeed_ref(env: Environment, ref: Any, base: Path, others: Iterable[Path], notes: list[str]) -> None:
    """The DeepSpeed config a training config names: read only when it is one of the files given, or lies in
    the config's folder or below the working directory (where the trainer itself would open it)."""
    if isinstance(ref, dict):
        _zero(env, ref)
        return
    if not isinstance(ref, str) or not ref or "\x00" in ref or len(ref) > 4096:
        return
    named = Path(ref).name
    given = [p for p in others if named and p.name == named]
    candidates = [*given, base / ref, Path(ref)]
    for path in candidates:
        try:
            if not path.exists():
                continue
            allowed = (
                path in given
                or _inside(path, base)
                or (not Path(ref).is_absolute() and _inside(path, Path.cwd()))
            )
        except (OSError, RuntimeError):  # a name too long, a link loop
            continue
        if not allowed:
            notes.append(
                f"the DeepSpeed config '{ref}' lies outside the config's folder and was not read; "
                "pass it too, to check its ZeRO stage and offload"
            )
            return
        try:
            doc = load_document(read_text(path, DS_LIMIT), str(path), as_json=True)
        except IngestError as exc:
            notes.append(f"DeepSpeed config {exc}")
            return
        if not isinstance(doc.data, dict):
            notes.append(f"DeepSpeed config {path}: not a JSON object")
            return
        _zero(env, doc.data)
        env.config_sources.append(str(path))
        notes.extend(doc.notes)
        return
    notes.append(
        f"the DeepSpeed config '{ref}' was not found; pass it too, to check its ZeRO stage and offload"
    )


def _fsdp(env: Environment, data: dict[str, Any]) -> None:
    fsdp = data.get("fsdp")
    cfg = data.get("fsdp_config") or {}
    offload = (isinstance(fsdp, str) and "offload" in fsdp) or (
        isinstance(cfg, dict) and (_bool(cfg.get("offload_params")) or _bool(cfg.get("fsdp_offload_params")))
    )
    if offload:
        env.offload = {**(env.offload or {}), "param": "cpu", "optimizer": "cpu"}
    strategy = Sharding.parse(fsdp)
    if isinstance(cfg, dict):
        for key in ("sharding_strategy", "fsdp_sharding_strategy"):
            strategy = Sharding.parse(cfg.get(key)) or strategy
        reshard = cfg.get("fsdp_reshard_after_forward", cfg.get("reshard_after_forward"))
        if isinstance(
            reshard, bool
        ):  # FSDP2: resharding after forward is FULL_SHARD, keeping is SHARD_GRAD_OP
            strategy = Sharding.FULL_SHARD if reshard else Sharding.SHARD_GRAD_OP
        else:
            strategy = Sharding.parse(reshard) or strategy
    if strategy is not None:
        env.fsdp_sharding = str(strategy)


def _deepspeed_keys(env: Environment, data: dict[str, Any]) -> None:
    """A DeepSpeed config's own keys: ZeRO stage, offload, batch sizes, precision."""
    _zero(env, data)
    env.micro_batch_size = _int(data.get("train_micro_batch_size_per_gpu"))
    env.grad_accum_steps = _int(data.get("gradient_accumulation_steps"))
    for key, dtype in (("bf16", "bf16"), ("fp16", "fp16")):
        section = data.get(key)
        if isinstance(section, dict) and _bool(section.get("enabled")):
            env.autocast_dtype = dtype


def _accelerate_keys(facts: ConfigFacts, data: dict[str, Any], base: Path, others: Iterable[Path]) -> None:
    """An Accelerate config: precision, processes, and the DeepSpeed or FSDP plugin it embeds or points at."""
    env = facts.env
    mp = str(data.get("mixed_precision") or "").lower()
    env.autocast_dtype = {"bf16": "bf16", "fp16": "fp16"}.get(mp)
    if mp == "no":
        env.param_dtype = "fp32"
    env.world_size = _int(data.get("num_processes"))
    ds = data.get("deepspeed_config")
    if isinstance(ds, dict):
        env.zero_stage = _int(ds.get("zero_stage"), minimum=0)
        offload = {}
        for key, what in (("offload_optimizer_device", "optimizer"), ("offload_param_device", "param")):
            device = str(ds.get(key) or "none").lower()
            if device not in ("none", ""):
                offload[what] = device
        env.offload = offload
        if ds.get("deepspeed_config_file"):
            _deepspeed_ref(env, ds["deepspeed_config_file"], base, others, facts.notes)
    _fsdp(env, {"fsdp_config": data.get("fsdp_config")})


def _axolotl_keys(facts: ConfigFacts, data: dict[str, Any], base: Path, others: Iterable[Path]) -> None:
    """An Axolotl config: its own key names for batch, packing, attention, adapters and quantization."""
    env = facts.env
    env.micro_batch_size = _int(data.get("micro_batch_size"))
    env.grad_accum_steps = _int(data.get("gradient_accumulation_steps"))
    env.packing = _bool(data.get("sample_packing"))
    if env.packing is None and _bool(data.get("pad_to_sequence_len")):
        env.packing = False
    env.max_seq_len = _int(data.get("sequence_len"))
    env.gradient_checkpointing = _bool(data.get("gradient_checkpointing"))
    env.dataloader.num_workers = _int(data.get("dataloader_num_workers"), minimum=0)
    env.dataloader.pin_memory = _bool(data.get("dataloader_pin_memory"))
    env.group_by_length = _bool(data.get("group_by_length"))
    env.eval_steps = _int(data.get("eval_steps"))
    env.save_steps = _int(data.get("save_steps"))
    env.logging_steps = _int(data.get("logging_steps"))
    env.torch_compile = _bool(data.get("torch_compile"))
    env.total_steps = _int(data.get("max_steps"))  # -1 (train by epochs) is not read: no steps per epoch here
    env.total_steps_from = "max_steps in the training config" if env.total_steps else None
    impl = data.get("attn_implementation")
    if isinstance(impl, str) and impl.lower() in ATTENTION_NAMES:
        env.attention.implementation = ATTENTION_NAMES[impl.lower()]
    for key, name in (
        ("flash_attention", "flash_attention_2"),
        ("sdp_attention", "sdpa"),
        ("xformers_attention", "xformers"),
        ("eager_attention", "eager"),
    ):
        if _bool(data.get(key)):
            env.attention.implementation = name
    _precision(env, data)
    facts.lora = str(data.get("adapter") or "").lower() in ("lora", "qlora")
    facts.quantized = bool(_bool(data.get("load_in_8bit")) or _bool(data.get("load_in_4bit")))
    _deepspeed_ref(env, data.get("deepspeed"), base, others, facts.notes)
    _fsdp(env, data)


def read_config(data: dict[str, Any], kind: str, path: Path, others: Iterable[Path] = ()) -> ConfigFacts:
    env = Environment()
    env.config_sources.append(str(path))
    facts = ConfigFacts(kind=kind, env=env)
    base = path.parent
    if kind == "deepspeed":
        _deepspeed_keys(env, data)
    elif kind == "accelerate":
        _accelerate_keys(facts, data, base, others)
    elif kind == "axolotl":
        _axolotl_keys(facts, data, base, others)
    elif kind in ("llama_factory", "hf_args"):
        _common_trainer_keys(env, data)
        if kind == "llama_factory":
            flash = str(data.get("flash_attn") or "").lower()
            if flash in ATTENTION_NAMES:
                env.attention.implementation = ATTENTION_NAMES[flash]
            if _bool(data.get("neat_packing")):
                env.packing = True
            facts.lora = str(data.get("finetuning_type") or "").lower() == "lora"
            facts.quantized = _int(data.get("quantization_bit")) is not None
        _deepspeed_ref(env, data.get("deepspeed"), base, others, facts.notes)
        _fsdp(env, data)
    else:
        raise ValueError(f"unknown config kind {kind!r}")
    sft_keys = {
        "packing",
        "dataset_text_field",
        "padding_free",
        "completion_only_loss",
        "assistant_only_loss",
    }
    ignored = _out_of_range(data)
    if ignored:
        facts.notes.append(f"{path.name}: out-of-range values ignored ({', '.join(ignored)[:200]})")
    env.framework = {"accelerate": "accelerate", "deepspeed": "deepspeed"}.get(
        kind, "trl" if kind == "hf_args" and sft_keys & set(data) else "hf_trainer"
    )
    return facts


FIELDS = (
    "device",
    "gpu_name",
    "gpu_count",
    "gpu_memory_bytes",
    "framework",
    "param_dtype",
    "autocast_dtype",
    "tf32",
    "gradient_checkpointing",
    "micro_batch_size",
    "grad_accum_steps",
    "zero_stage",
    "zero_hpz",
    "fsdp_sharding",
    "offload",
    "world_size",
    "packing",
    "group_by_length",
    "max_seq_len",
    "eval_steps",
    "save_steps",
    "logging_steps",
    "torch_compile",
    "total_steps",
    "total_steps_from",
)
QUIET = {"total_steps_from"}  # who said it: a disagreement shows on the figure itself


def merge_into(target: Environment, source: Environment, notes: list[str]) -> None:
    """Fill what ``target`` does not know from ``source``; say so where the two disagree."""
    for name in FIELDS:
        mine, theirs = getattr(target, name), getattr(source, name)
        if theirs is None:
            continue
        if mine is None or (name == "offload" and mine == {} and theirs):
            setattr(target, name, theirs)
        elif mine != theirs and name not in QUIET and not (name == "offload" and theirs == {}):
            notes.append(
                f"{name}: {mine!r} from one source, {theirs!r} from {source.config_sources[:1] or 'another'}"
            )
    for sub in ("dataloader", "attention", "model"):
        a, b = getattr(target, sub), getattr(source, sub)
        for key, value in vars(b).items():
            if value is not None and getattr(a, key) is None:
                setattr(a, key, value)
    target.config_sources += [s for s in source.config_sources if s not in target.config_sources]
    target.versions = {**source.versions, **target.versions}
