"""Training configurations into Environment facts: TrainingArguments / SFTConfig (JSON or YAML), axolotl,
LLaMA-Factory, Accelerate and LightningCLI YAML, DeepSpeed JSON.

Each reader fills only what its file states; "auto" and missing keys stay None, so a later source (or a
measurement) can still say. Relative paths inside a config (a DeepSpeed file named by axolotl) are looked up
beside the config and among the other files given.

Settings that slow every step are read as the run resolves them, by each framework's own rule (the installed
sources were read for each): DDP's unused-parameter search, reentrant activation checkpointing, torch.compile's
``dynamic``, anomaly detection, per-step cross-rank gathers for metrics and per-step cache emptying. Each fact
names the setting that says it in ``Environment.configured_by``, for a finding's evidence. A default that
depends on the run's process count (the Trainer's ``ddp_find_unused_parameters=None``) is resolved once every
file is read (``resolve_defaults``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.artifacts import IngestError, read_text
from pitstop.core.profile import Environment, QuantizedBase, RlSettings
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
    # DDP's unused-parameter search as a framework's default resolves it when the config leaves it unset,
    # with why: it holds only on several processes, which the other files may tell (resolve_defaults)
    ddp_default: tuple[bool, str] | None = None


LIGHTNING_TOP_KEYS = {"model", "data", "seed_everything", "ckpt_path", "optimizer", "lr_scheduler"}
LIGHTNING_TRAINER_KEYS = {
    "accelerator",
    "strategy",
    "devices",
    "num_nodes",
    "precision",
    "max_epochs",
    "max_steps",
    "accumulate_grad_batches",
    "detect_anomaly",
    "log_every_n_steps",
    "callbacks",
    "logger",
}


def _is_lightning(data: dict[str, Any]) -> bool:
    """A LightningCLI config (``fit --config``, or the config.yaml it saves): a ``trainer`` section of the
    Trainer's arguments beside the model's and the data's."""
    trainer = data.get("trainer")
    if not isinstance(trainer, dict):
        return False
    return bool(set(data) & LIGHTNING_TOP_KEYS) or len(set(trainer) & LIGHTNING_TRAINER_KEYS) >= 2


def config_kind(data: Any) -> str | None:
    """Which kind of training config a parsed JSON / YAML document is, from its keys."""
    if not isinstance(data, dict):
        return None
    keys = set(data)
    if _is_lightning(data):
        return "lightning"
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
    env.gradient_checkpointing = _trainer_checkpointing(data)[0]
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
    env.torch_compile = _compile_asked(data)
    env.total_steps = _int(data.get("max_steps"))  # -1 (train by epochs) is not read: no steps per epoch here
    env.total_steps_from = "max_steps in the training config" if env.total_steps else None
    impl = data.get("attn_implementation")
    init = data.get("model_init_kwargs")
    if impl is None and isinstance(init, dict):
        impl = init.get("attn_implementation")
    if isinstance(impl, str) and impl.lower() in ATTENTION_NAMES:
        env.attention.implementation = ATTENTION_NAMES[impl.lower()]
    _precision(env, data)


# -- settings that slow every step (issue 40), each as its framework resolves it --------------------------------

KWARGS_LIMIT = 10_000  # a kwargs dict written as a JSON string is a short object
# checkpointing kwargs the Trainer pops before torch.utils.checkpoint sees the rest
TRAINER_ONLY_KWARGS = ("every_n_layers", "offload")
TOKENS_SEEN_ON = ("all", "non_padding", "true", "yes")  # include_num_input_tokens_seen values that count


def _kwargs(value: Any) -> dict[str, Any] | None:
    """A kwargs dict as TrainingArguments takes it: a dict, or a JSON string of one (it parses those)."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value.strip().startswith("{") and len(value) <= KWARGS_LIMIT:
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            return None
        return parsed if isinstance(parsed, dict) else None
    return None


def _setting(key: str, value: Any) -> str:
    """A setting as a user writes it in Python: ``ddp_find_unused_parameters=True``."""
    shown = repr(value)
    return f"{key}={shown if len(shown) <= 80 else shown[:77] + '...'}"


def _say(env: Environment, name: str, source: str, why: str) -> None:
    """Which setting of which file says a configured fact (the finding's evidence)."""
    env.configured_by[name] = f"{source}: {why}"


def _trainer_checkpointing(data: dict[str, Any]) -> tuple[bool | None, dict[str, Any] | None, str]:
    """Activation checkpointing as TrainingArguments resolves it (transformers 5): ``activation_checkpointing*``,
    else its deprecated alias ``gradient_checkpointing*``, each name used only when the newer one is unset:
    (on, kwargs, the kwargs' key)."""
    on = _bool(data.get("activation_checkpointing"))
    if on is None:
        on = _bool(data.get("gradient_checkpointing"))
    for key in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"):
        if data.get(key) is not None:
            return on, _kwargs(data.get(key)), key
    return on, None, "gradient_checkpointing_kwargs"


def _reentrant_of(kwargs: dict[str, Any] | None, key: str) -> tuple[bool | None, str | None]:
    """``use_reentrant`` as torch.utils.checkpoint receives it from checkpointing kwargs: as written; or, with
    other keys and no ``use_reentrant``, torch's own default (reentrant: torch/utils/checkpoint.py warns and
    takes True when it is not passed). None where no kwargs reach it: the library's default decides."""
    if kwargs is None:
        return None, None
    rest = {k: v for k, v in kwargs.items() if k not in TRAINER_ONLY_KWARGS}
    if "use_reentrant" in rest:
        value = _bool(rest["use_reentrant"])
        return value, None if value is None else f"{key} has use_reentrant={value}"
    if rest:
        return True, (
            f"{key} without use_reentrant ({', '.join(sorted(map(str, rest)))[:80]}): torch.utils.checkpoint "
            "then takes its default, reentrant"
        )
    return None, None


def _compile_asked(data: dict[str, Any]) -> bool | None:
    """``torch_compile``; TrainingArguments also switches it on for a backend or a mode alone."""
    asked = _bool(data.get("torch_compile"))
    if asked is None and (data.get("torch_compile_backend") or data.get("torch_compile_mode")):
        return True
    return asked


def _compile_dynamic(env: Environment, data: dict[str, Any], source: str) -> None:
    """The Trainer passes ``dynamic=None`` to torch.compile (torch decides: a shape that changes is marked
    dynamic after its first recompile), and ``dynamic=False`` for the neuron backend: there is no key for it."""
    backend = data.get("torch_compile_backend")
    if env.torch_compile and isinstance(backend, str) and backend.lower() == "neuron":
        env.compile_dynamic = False
        _say(
            env,
            "compile_dynamic",
            source,
            "torch_compile_backend='neuron': the Trainer compiles with dynamic=False",
        )


def _tokens_seen(env: Environment, key: str, value: Any, source: str, note: str = "") -> None:
    """``include_num_input_tokens_seen`` (or a framework's name for it): the Trainer gathers each micro-batch's
    token count across processes (``accelerator.gather``) on every step it trains."""
    if value is None:
        return
    on = value is True or (isinstance(value, str) and value.strip().lower() in TOKENS_SEEN_ON)
    env.metric_sync_per_step = [_setting(key, value)] if on else []
    if on:
        _say(
            env,
            "metric_sync_per_step",
            source,
            f"{_setting(key, value)}{note}: the token count is gathered from every process each micro-batch",
        )


def _empty_cache(env: Environment, data: dict[str, Any], source: str) -> None:
    """``torch_empty_cache_steps``: the Trainer empties the device cache every N steps (accelerate's
    ``clear_device_cache``)."""
    steps = _int(data.get("torch_empty_cache_steps"))
    if steps is not None:
        env.empty_cache_steps = steps
        _say(
            env,
            "empty_cache_steps",
            source,
            f"{_setting('torch_empty_cache_steps', steps)}: the device cache is emptied every {steps} steps",
        )


def _debug_notes(data: dict[str, Any], source: str, notes: list[str]) -> None:
    """TrainingArguments' debugging aids that cost every step, said as notes (no rule reads them from a config)."""
    debug = data.get("debug")
    options = (
        debug.split()
        if isinstance(debug, str)
        else [str(d) for d in debug]
        if isinstance(debug, list)
        else []
    )
    if "underflow_overflow" in options:
        notes.append(
            f"{source}: debug='underflow_overflow' hooks every module to check its inputs and outputs for inf and "
            "NaN on every forward (transformers' DebugUnderflowOverflow): a debugging aid that slows each step"
        )
    if _bool(data.get("full_determinism")):
        notes.append(
            f"{source}: full_determinism=True switches torch.use_deterministic_algorithms(True) on for the whole "
            "run: deterministic kernels are slower where they differ"
        )


def _trainer_settings(facts: ConfigFacts, data: dict[str, Any], source: str) -> None:
    """TrainingArguments / SFTConfig (and what LLaMA-Factory passes to them)."""
    env = facts.env
    on, kwargs, kw_key = _trainer_checkpointing(data)
    if on:
        value, why = _reentrant_of(kwargs, kw_key)
        if value is not None and why is not None:
            env.checkpoint_reentrant = value
            _say(env, "checkpoint_reentrant", source, why)
        # no kwargs: transformers' own default, use_reentrant=True until its 2026 switch to False
        # (huggingface/transformers#43203), and TRL's False since trl#4811: the release decides, left unknown
    written = _bool(data.get("ddp_find_unused_parameters"))
    if written is not None:
        env.ddp_find_unused_parameters = written
        _say(env, "ddp_find_unused_parameters", source, _setting("ddp_find_unused_parameters", written))
    elif not on:
        # the Trainer's rule (trainer.py _build_accelerator_args): None -> on, unless the model is a
        # PreTrainedModel with activation checkpointing on (with it on, a PEFT-wrapped model still searches:
        # which one runs is not in the config, so that case is left unknown)
        facts.ddp_default = (
            True,
            f"{source}: ddp_find_unused_parameters unset, and no gradient checkpointing: the Trainer's default "
            "then searches the autograd graph for unused parameters every step",
        )
    if _bool(data.get("ddp_static_graph")):
        env.ddp_find_unused_parameters = False  # DDP skips the search with a static graph
        facts.ddp_default = None
        _say(
            env,
            "ddp_find_unused_parameters",
            source,
            "ddp_static_graph=True: DDP does not search with a static graph",
        )
    _compile_dynamic(env, data, source)
    _tokens_seen(env, "include_num_input_tokens_seen", data.get("include_num_input_tokens_seen"), source)
    _empty_cache(env, data, source)
    _debug_notes(data, source, facts.notes)
    _rl_settings(env, data, source)


def _rl_settings(env: Environment, data: dict[str, Any], source: str) -> None:
    """An online RL trainer's rollout settings (GRPOConfig / RLOOConfig / OnlineDPOConfig, saved as the run's
    arguments): every such config has ``use_vllm``, which no other trainer's has."""
    use_vllm = _bool(data.get("use_vllm"))
    if use_vllm is None:
        return
    memory = data.get("vllm_gpu_memory_utilization")
    batching = _bool(data.get("use_transformers_continuous_batching")) or _bool(
        data.get("use_transformers_paged")
    )
    env.rl = RlSettings(
        use_vllm=use_vllm,
        vllm_mode=str(data["vllm_mode"]) if use_vllm and data.get("vllm_mode") else None,
        vllm_gpu_memory_utilization=float(memory) if use_vllm and isinstance(memory, int | float) else None,
        continuous_batching=batching,
        num_generations=_int(data.get("num_generations")),
        generation_batch_size=_int(data.get("generation_batch_size")),
        steps_per_generation=_int(data.get("steps_per_generation")),
        num_iterations=_int(data.get("num_iterations")),
        max_completion_length=_int(data.get("max_completion_length")) or _int(data.get("max_new_tokens")),
    )
    _say(env, "rl", source, _setting("use_vllm", use_vllm))


def _llama_factory_settings(facts: ConfigFacts, data: dict[str, Any], source: str) -> None:
    """LLaMA-Factory checkpoints the model itself unless ``disable_gradient_checkpointing`` (with
    ``use_reentrant_gc``, default True, unless ``use_unsloth_gc`` swaps the function), and sets
    ``ddp_find_unused_parameters=False`` for LoRA when it is unset (hparams/parser.py, model_utils/checkpointing.py)."""
    env = facts.env
    own = not _bool(data.get("disable_gradient_checkpointing"))
    if own:
        env.gradient_checkpointing = True
        _say(
            env,
            "gradient_checkpointing",
            source,
            "LLaMA-Factory checkpoints the model unless disable_gradient_checkpointing",
        )
        if not _bool(data.get("use_unsloth_gc")):
            written = _bool(data.get("use_reentrant_gc"))
            env.checkpoint_reentrant = True if written is None else written
            why = (
                "use_reentrant_gc unset: LLaMA-Factory's default is True"
                if written is None
                else _setting("use_reentrant_gc", written)
            )
            _say(env, "checkpoint_reentrant", source, why)
    if env.ddp_find_unused_parameters is None:
        facts.ddp_default = None
        if str(data.get("finetuning_type") or "").lower() == "lora":
            env.ddp_find_unused_parameters = False
            _say(
                env,
                "ddp_find_unused_parameters",
                source,
                "ddp_find_unused_parameters unset with LoRA: LLaMA-Factory sets it to False",
            )
        elif env.gradient_checkpointing:
            env.ddp_find_unused_parameters = False
            _say(
                env,
                "ddp_find_unused_parameters",
                source,
                "ddp_find_unused_parameters unset: the Trainer's default for a checkpointed PreTrainedModel is False",
            )
        else:
            facts.ddp_default = (
                True,
                f"{source}: ddp_find_unused_parameters unset, checkpointing disabled: the Trainer's default then "
                "searches the autograd graph for unused parameters every step",
            )


def _axolotl_settings(facts: ConfigFacts, data: dict[str, Any], source: str) -> None:
    """axolotl's resolutions (utils/config normalize_config, core/builders): in DDP it passes
    ``bool(ddp_find_unused_parameters)`` (unset: off); with gradient checkpointing and no kwargs it sets
    ``use_reentrant: True`` (not for RL, ``unfrozen_parameters`` or activation offloading);
    ``include_tokens_per_second`` becomes the Trainer's ``include_num_input_tokens_seen``."""
    env = facts.env
    written = _bool(data.get("ddp_find_unused_parameters"))
    env.ddp_find_unused_parameters = bool(written)
    why = (
        _setting("ddp_find_unused_parameters", written)
        if written is not None
        else "ddp_find_unused_parameters unset: axolotl passes False in DDP"
    )
    _say(env, "ddp_find_unused_parameters", source, why)
    kwargs = _kwargs(data.get("gradient_checkpointing_kwargs"))
    checkpointing = data.get("gradient_checkpointing")
    if _bool(checkpointing) and not data.get("activation_offloading"):
        value, reason = _reentrant_of(kwargs, "gradient_checkpointing_kwargs")
        if (
            value is None
            and data.get("gradient_checkpointing_kwargs") is None
            and not data.get("rl")
            and data.get("unfrozen_parameters") is None
        ):
            value, reason = True, "gradient_checkpointing_kwargs unset: axolotl then sets use_reentrant: True"
        if value is not None and reason is not None:
            env.checkpoint_reentrant = value
            _say(env, "checkpoint_reentrant", source, reason)
    _compile_dynamic(env, data, source)
    _tokens_seen(
        env,
        "include_tokens_per_second",
        data.get("include_tokens_per_second"),
        source,
        " (axolotl passes it as the Trainer's include_num_input_tokens_seen)",
    )
    _empty_cache(env, data, source)


def _accelerate_settings(facts: ConfigFacts, data: dict[str, Any], source: str) -> None:
    """An Accelerate config's ``dynamo_config`` (torch.compile through the Accelerator, ``dynamo_use_dynamic``
    as its ``dynamic``) and ``debug`` (said as a note: no rule reads it from a config)."""
    env = facts.env
    dynamo = data.get("dynamo_config")
    if isinstance(dynamo, dict):
        backend = str(dynamo.get("dynamo_backend") or "no").strip().lower()
        env.torch_compile = backend not in ("no", "none", "")
        dynamic = _bool(dynamo.get("dynamo_use_dynamic"))
        if env.torch_compile and dynamic is not None:
            env.compile_dynamic = dynamic
            _say(env, "compile_dynamic", source, f"dynamo_config.dynamo_use_dynamic: {str(dynamic).lower()}")
    if _bool(data.get("debug")):
        facts.notes.append(
            f"{source}: debug: true sets ACCELERATE_DEBUG_MODE, which checks tensor shapes across processes "
            "with an extra gather before each of accelerate's gather / reduce / pad operations: it costs every "
            "step where the job calls them every step"
        )


LIGHTNING_PRECISION = {"bf16": "bf16", "bf16-mixed": "bf16", "16": "fp16", "16-mixed": "fp16"}
LIGHTNING_DDP_FLAG = re.compile(r"^ddp(?:_spawn|_fork|_notebook)?_find_unused_parameters_(true|false)$")


def _devices(value: Any) -> int | None:
    """Lightning's ``devices``: a count, a list of indices, or a string of either ("0,1", "2"); "auto" and -1
    are not a statement."""
    if isinstance(value, list):
        return len(value) or None
    if isinstance(value, str) and "," in value:
        return len([v for v in value.split(",") if v.strip()]) or None
    return _int(value)


def _lightning_strategy(facts: ConfigFacts, strategy: Any, source: str) -> None:
    """``trainer.strategy``: a registered name (``ddp_find_unused_parameters_true``, ``deepspeed_stage_2``)
    or a class_path / init_args mapping (``DDPStrategy`` with ``find_unused_parameters``, ``static_graph``).
    Lightning 2's plain ``ddp`` does not search; Lightning 1's did, so a plain name is left unread."""
    env = facts.env
    if isinstance(strategy, str):
        name = strategy.strip().lower()
        flag = LIGHTNING_DDP_FLAG.match(name)
        if flag:
            env.ddp_find_unused_parameters = flag.group(1) == "true"
            _say(env, "ddp_find_unused_parameters", source, f"trainer.strategy: {strategy}")
        stage = re.fullmatch(r"deepspeed_stage_([123])(_offload)?", name)
        if stage:
            env.zero_stage = int(stage.group(1))
            env.offload = {"optimizer": "cpu"} if stage.group(2) else {}
        return
    if not isinstance(strategy, dict):
        return
    cls = str(strategy.get("class_path") or "")
    args = strategy.get("init_args") if isinstance(strategy.get("init_args"), dict) else {}
    if not cls.endswith("DDPStrategy") or not isinstance(args, dict):
        return
    find = _bool(args.get("find_unused_parameters"))
    if _bool(args.get("static_graph")):
        env.ddp_find_unused_parameters = False
        _say(
            env,
            "ddp_find_unused_parameters",
            source,
            "trainer.strategy.init_args.static_graph: true: DDP does not search with a static graph",
        )
    elif find is not None:
        env.ddp_find_unused_parameters = find
        _say(
            env,
            "ddp_find_unused_parameters",
            source,
            f"trainer.strategy.init_args.find_unused_parameters: {str(find).lower()}",
        )


def _lightning_keys(facts: ConfigFacts, data: dict[str, Any], source: str) -> None:
    """A LightningCLI config's ``trainer`` section: the Trainer's arguments as the CLI passes them."""
    env = facts.env
    trainer = data.get("trainer")
    assert isinstance(trainer, dict)
    _lightning_strategy(facts, trainer.get("strategy"), source)
    anomaly = _bool(trainer.get("detect_anomaly"))
    if anomaly is not None:
        env.anomaly_detection = anomaly
        _say(env, "anomaly_detection", source, f"trainer.detect_anomaly: {str(anomaly).lower()}")
    devices, nodes = _devices(trainer.get("devices")), _int(trainer.get("num_nodes"))
    if devices is not None:
        env.world_size = devices * (nodes or 1)
    precision = str(trainer.get("precision") or "").strip().lower()
    if precision in LIGHTNING_PRECISION:
        env.autocast_dtype = LIGHTNING_PRECISION[precision]
    elif precision in ("32", "32-true"):
        env.param_dtype = "fp32"
    env.grad_accum_steps = _int(trainer.get("accumulate_grad_batches"))
    env.logging_steps = _int(trainer.get("log_every_n_steps"))
    env.total_steps = _int(trainer.get("max_steps"))  # -1 (train by epochs) is not read
    env.total_steps_from = "trainer.max_steps in the LightningCLI config" if env.total_steps else None
    if _bool(trainer.get("deterministic")):
        facts.notes.append(
            f"{source}: trainer.deterministic: true switches torch.use_deterministic_algorithms(True) on: "
            "deterministic kernels are slower where they differ"
        )
    profiler = trainer.get("profiler")
    if profiler not in (None, False, "", "null", "none"):
        shown = (
            profiler
            if isinstance(profiler, str)
            else (profiler.get("class_path") if isinstance(profiler, dict) else "set")
        )
        facts.notes.append(
            f"{source}: trainer.profiler: {str(shown)[:80]} profiles the whole run: a profiler left on slows every step"
        )


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


def _dtype_word(value: Any) -> str | None:
    """A dtype as a config writes it ("bfloat16", "torch.bfloat16", "bf16") as torch names it."""
    word = str(value or "").replace("torch.", "").lower()
    return {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "half": "float16"}.get(
        word, word or None
    )


def quantization_from_hf(config: dict[str, Any], set_by: str) -> QuantizedBase | None:
    """A Hugging Face ``quantization_config`` (``BitsAndBytesConfig.to_dict()``, a config.json's, a torchao one)
    as a QuantizedBase without layers or timing; None when it quantizes nothing. The live probe reads a
    model's own config with it too."""
    method = str(config.get("quant_method") or "").lower()
    four = bool(_bool(config.get("load_in_4bit")) or _bool(config.get("_load_in_4bit")))
    eight = bool(_bool(config.get("load_in_8bit")) or _bool(config.get("_load_in_8bit")))
    if method == "torchao":
        quant = config.get("quant_type")
        name = quant.get("default", quant) if isinstance(quant, dict) else quant
        return QuantizedBase(library="torchao", quant_type=str(name) if name else None, set_by=set_by)
    if not (four or eight):
        return None
    return QuantizedBase(
        library="bitsandbytes",
        quant_type=str(config.get("bnb_4bit_quant_type") or "fp4") if four else "int8",  # fp4: bnb's default
        bits=4 if four else 8,
        double_quant=bool(_bool(config.get("bnb_4bit_use_double_quant"))) if four else None,
        compute_dtype=_dtype_word(config.get("bnb_4bit_compute_dtype")) if four else None,
        set_by=set_by,
    )


def checkpoint_quantization(data: Any, source: str) -> QuantizedBase | None:
    """A quantized checkpoint's config.json: its ``quantization_config``, where it has one."""
    config = data.get("quantization_config") if isinstance(data, dict) else None
    if not isinstance(config, dict):
        return None
    return quantization_from_hf(config, f"{source}: quantization_config")


def _quantization(data: dict[str, Any], kind: str, source: str) -> QuantizedBase | None:
    """The quantized base a training config asks for, by each framework's keys and defaults: TRL's
    ModelConfig (``load_in_4bit``, ``bnb_4bit_quant_type`` nf4, ``use_bnb_nested_quant``, compute in ``dtype``)
    or ``model_init_kwargs.quantization_config``; axolotl's ``load_in_4bit`` / ``load_in_8bit`` (nf4, double
    quantization, compute in the training dtype); LLaMA-Factory's ``quantization_bit`` (bnb, nf4, double
    quantization by default)."""
    init = data.get("model_init_kwargs")
    if isinstance(init, dict) and isinstance(init.get("quantization_config"), dict):
        return quantization_from_hf(
            init["quantization_config"], f"{source}: model_init_kwargs.quantization_config"
        )
    compute = _dtype_word(data.get("dtype") or data.get("torch_dtype"))
    if compute in (None, "auto"):
        compute = "bfloat16" if _bool(data.get("bf16")) else "float16" if _bool(data.get("fp16")) else None
    if kind == "llama_factory":
        bits = _int(data.get("quantization_bit"))
        method = str(data.get("quantization_method") or "bnb").lower()
        if bits not in (4, 8) or method not in ("bnb", "bitsandbytes"):
            return None
        config = {
            f"load_in_{bits}bit": True,
            "bnb_4bit_quant_type": data.get("quantization_type") or "nf4",
            "bnb_4bit_use_double_quant": data.get("double_quantization", True),
            "bnb_4bit_compute_dtype": compute,
        }
        return quantization_from_hf(config, f"{source}: quantization_bit: {bits}")
    four, eight = _bool(data.get("load_in_4bit")), _bool(data.get("load_in_8bit"))
    if not (four or eight):
        return None
    axolotl = kind == "axolotl"
    config = {
        "load_in_4bit": four,
        "load_in_8bit": eight and not four,
        "bnb_4bit_quant_type": data.get("bnb_4bit_quant_type") or "nf4",
        "bnb_4bit_use_double_quant": True if axolotl else data.get("use_bnb_nested_quant", False),
        "bnb_4bit_compute_dtype": compute,
    }
    return quantization_from_hf(config, f"{source}: load_in_{4 if four else 8}bit: true")


def _experts_setting(env: Environment, data: dict[str, Any], source: str) -> None:
    """``experts_implementation`` for a mixture-of-experts model, written at the top (axolotl, LLaMA-Factory) or
    in TRL's ``model_init_kwargs``: "eager" loops over the experts (moe_experts_loop)."""
    init = _kwargs(data.get("model_init_kwargs")) or {}
    value = data.get("experts_implementation", init.get("experts_implementation"))
    if isinstance(value, str) and value.strip():
        env.experts_implementation = value.strip()
        where = "model_init_kwargs: " if "experts_implementation" not in data else ""
        _say(env, "experts_implementation", source, where + _setting("experts_implementation", value.strip()))


def read_config(data: dict[str, Any], kind: str, path: Path, others: Iterable[Path] = ()) -> ConfigFacts:
    env = Environment()
    env.config_sources.append(str(path))
    facts = ConfigFacts(kind=kind, env=env)
    base, source = path.parent, path.name
    if kind == "deepspeed":
        _deepspeed_keys(env, data)
    elif kind == "accelerate":
        _accelerate_keys(facts, data, base, others)
        _accelerate_settings(facts, data, source)
    elif kind == "axolotl":
        _axolotl_keys(facts, data, base, others)
        _axolotl_settings(facts, data, source)
    elif kind == "lightning":
        _lightning_keys(facts, data, source)
    elif kind in ("llama_factory", "hf_args"):
        _common_trainer_keys(env, data)
        _trainer_settings(facts, data, source)
        if kind == "llama_factory":
            _llama_factory_settings(facts, data, source)
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
    _experts_setting(env, data, source)
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
    env.framework = {"accelerate": "accelerate", "deepspeed": "deepspeed", "lightning": "lightning"}.get(
        kind, "trl" if kind == "hf_args" and sft_keys & set(data) else "hf_trainer"
    )
    if kind in ("axolotl", "llama_factory", "hf_args"):
        env.quantized_base = _quantization(data, kind, source)
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
    "compile_dynamic",
    "ddp_find_unused_parameters",
    "checkpoint_reentrant",
    "anomaly_detection",
    "experts_implementation",
    "empty_cache_steps",
    "total_steps",
    "total_steps_from",
    "quantized_base",
    "rl",
)
QUIET = {"total_steps_from", "quantized_base", "rl"}  # who said it: a disagreement shows on the figure itself


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
    if source.metric_sync_per_step is not None:  # every source's gathers: they add up
        known = target.metric_sync_per_step or []
        target.metric_sync_per_step = known + [s for s in source.metric_sync_per_step if s not in known]
    target.configured_by = {**source.configured_by, **target.configured_by}
    target.config_sources += [s for s in source.config_sources if s not in target.config_sources]
    target.versions = {**source.versions, **target.versions}


def resolve_defaults(env: Environment, facts: Iterable[ConfigFacts], notes: list[str]) -> None:
    """Defaults that hold only on several processes, once every file has been read: DDP wraps the model only
    then, so the Trainer's ``ddp_find_unused_parameters=None`` resolves only where the process count is known
    to be more than one (an Accelerate or LightningCLI config, traces, ``--gpus``); unknown, a note says so."""
    for fact in facts:
        if fact.ddp_default is None or env.ddp_find_unused_parameters is not None:
            continue
        value, why = fact.ddp_default
        if (env.world_size or 0) > 1:
            env.ddp_find_unused_parameters = value
            env.configured_by["ddp_find_unused_parameters"] = why
        elif env.world_size is None:
            notes.append(
                f"{why.split(':', 1)[0]}: ddp_find_unused_parameters is unset, and on several processes the "
                "Trainer's default then searches the autograd graph for unused parameters every step (a model "
                "without gradient checkpointing): give --gpus N or the launcher's config to check it"
            )
        return
