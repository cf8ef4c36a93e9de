"""The words pitstop's documents use, as enums. Each member *is* its string (StrEnum), so JSON and old
documents read the same; code compares against members, never against loose string literals."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, Enum):
        def __str__(self) -> str:
            return str(self.value)


class Framework(StrEnum):
    """What drives the training loop; a fix is written for it."""

    PYTORCH = "pytorch"
    HF_TRAINER = "hf_trainer"
    TRL = "trl"
    ACCELERATE = "accelerate"
    LIGHTNING = "lightning"
    DEEPSPEED = "deepspeed"

    @property
    def is_trainer(self) -> bool:
        """HF Trainer and TRL's trainers take the same TrainingArguments-style settings."""
        return self in (Framework.HF_TRAINER, Framework.TRL)

    @property
    def args_class(self) -> str:
        """The arguments class a Trainer-style job sets (SFTConfig for TRL)."""
        return "SFTConfig" if self is Framework.TRL else "TrainingArguments"

    @property
    def trainer_class(self) -> str:
        """The trainer class a Trainer-style job builds (SFTTrainer for TRL)."""
        return "SFTTrainer" if self is Framework.TRL else "Trainer"

    @classmethod
    def of(cls, value: str | None) -> Framework:
        """The framework named by ``value``; plain PyTorch when unknown."""
        try:
            return cls(value) if value else cls.PYTORCH
        except ValueError:
            return cls.PYTORCH


class Severity(StrEnum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"

    @property
    def order(self) -> int:
        """0 for the most severe."""
        return _SEVERITY_ORDER[self]


_SEVERITY_ORDER = {Severity.HIGH: 0, Severity.MEDIUM: 1, Severity.LOW: 2}


class CauseId(StrEnum):
    """The cause ids: a Finding's ``cause`` in every document. Each member has one module that says what it
    means and finds it (``pitstop.diagnose.causes.<id>``). An id, once released, keeps its meaning; a new cause
    is a new member and its module."""

    DATALOADER_BOUND = "dataloader_bound"
    SMALL_BATCH = "small_batch"
    PADDING_WASTE = "padding_waste"
    SLOW_ATTENTION = "slow_attention"
    OFFLOAD_BOUND = "offload_bound"
    NO_MIXED_PRECISION = "no_mixed_precision"
    HOST_SYNC = "host_sync"
    PAGEABLE_COPIES = "pageable_copies"
    COMMUNICATION_BOUND = "communication_bound"
    STRAGGLER = "straggler"
    EVAL_OVERHEAD = "eval_overhead"
    IDLE_GPU = "idle_gpu"
    NEEDLESS_RECOMPUTE = "needless_recompute"
    CHECKPOINT_STALL = "checkpoint_stall"
    CPU_OVERSUBSCRIBED = "cpu_oversubscribed"
    UNFUSED_KERNELS = "unfused_kernels"
    ALLOCATOR_THRASH = "allocator_thrash"
    GPU_THROTTLED = "gpu_throttled"
    OVERSHARDED = "oversharded"
    GC_PAUSES = "gc_pauses"
    DEBUG_MODES = "debug_modes"
    DDP_FIND_UNUSED = "ddp_find_unused"
    RECOMPILES = "recompiles"
    PER_STEP_CLEANUP = "per_step_cleanup"
    METRIC_SYNC = "metric_sync"
    REENTRANT_CHECKPOINTING = "reentrant_checkpointing"
    SLOW_LINKS = "slow_links"
    MOE_EXPERTS_LOOP = "moe_experts_loop"
    QUANTIZED_BASE = "quantized_base"
    MIXED_GPUS = "mixed_gpus"
    RL_GENERATION = "rl_generation"
    LIBRARY_UPGRADE = "library_upgrade"
    SHARDING_OVERHEAD = "sharding_overhead"
    LOW_MFU_UNEXPLAINED = "low_mfu_unexplained"

    @classmethod
    def parse(cls, value: object) -> CauseId | None:
        """The cause a document names; None for anything else (an id of a newer pitstop, a damaged field)."""
        if not isinstance(value, str):
            return None
        try:
            return cls(value)
        except ValueError:
            return None


class RemedyId(StrEnum):
    """Stable ids: tune's ``--try`` / ``--skip`` names and the ``fix`` of tune's JSON."""

    ATTENTION = "attention"
    PRETOKENIZE = "pretokenize"
    WORKERS = "workers"
    TRIM_PADDING = "trim_padding"
    PACK_BATCH = "pack_batch"
    PACK = "pack"
    GROUP_BY_LENGTH = "group_by_length"
    MICRO_BATCH = "micro_batch"
    TF32 = "tf32"
    BF16 = "bf16"
    FP16 = "fp16"
    NO_CHECKPOINTING = "no_checkpointing"
    PIN_MEMORY = "pin_memory"
    NO_OFFLOAD = "no_offload"
    FEWER_SYNCS = "fewer_syncs"
    BALANCE_RANKS = "balance_ranks"
    FUSED_KERNELS = "fused_kernels"
    OVERLAP_COMM = "overlap_comm"
    EVAL_LESS_OFTEN = "eval_less_often"
    USE_EVERY_GPU = "use_every_gpu"
    SAVE_LESS_OFTEN = "save_less_often"
    CPU_THREADS = "cpu_threads"
    FUSED_OPTIMIZER = "fused_optimizer"
    COMPILE_MODEL = "compile_model"
    LIGER_KERNELS = "liger_kernels"
    EXPANDABLE_SEGMENTS = "expandable_segments"
    UNTHROTTLE_GPU = "unthrottle_gpu"
    BIGGER_BUCKETS = "bigger_buckets"
    NO_SYNC_ACCUMULATION = "no_sync_accumulation"
    FIX_TRANSPORT = "fix_transport"
    NCCL_BACKEND = "nccl_backend"
    LIGHTER_SHARDING = "lighter_sharding"
    MANUAL_GC = "manual_gc"
    DEBUG_OFF = "debug_off"
    NO_UNUSED_SEARCH = "no_unused_search"
    DYNAMIC_COMPILE = "dynamic_compile"
    LENGTH_BUCKETS = "length_buckets"
    NO_PER_STEP_CLEANUP = "no_per_step_cleanup"
    SYNC_METRICS_LESS = "sync_metrics_less"
    NON_REENTRANT_CHECKPOINTING = "non_reentrant_checkpointing"
    COMMUNICATE_LESS = "communicate_less"
    GROUPED_EXPERTS = "grouped_experts"
    BF16_LORA = "bf16_lora"
    MATCH_GPUS = "match_gpus"
    FASTER_GENERATION = "faster_generation"
    PIN_VERSIONS = "pin_versions"
    PLAIN_DDP = "plain_ddp"


class Device(StrEnum):
    CPU = "cpu"
    CUDA = "cuda"
    ROCM = "rocm"
    MPS = "mps"


class Workload(StrEnum):
    """What a profiler trace recorded: training steps (a backward pass, an optimizer) or batches of inference /
    evaluation (neither: ``inference_mode``, ``no_grad``); a rule's advice is for the one it was."""

    TRAINING = "training"
    INFERENCE = "inference"


class RuntimeApi(StrEnum):
    """What a CUDA / HIP runtime call does, as far as the time the host spends in it goes."""

    ALLOC = "alloc"  # cudaMalloc / cudaFree / hipMalloc / hipFree: the allocator going to the driver
    SYNC = "sync"  # cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize (and HIP's)
    BLOCKING_COPY = (
        "blocking_copy"  # a copy the host waits for (cudaMemcpy, hipMemcpyWithStream, to pageable)
    )
    LAUNCH = "launch"  # kernel launches
    OTHER = "other"


class Source(StrEnum):
    """Where a RunProfile came from."""

    DOCTOR = "doctor"
    CALLBACK = "callback"
    WATCH = "watch"
    ANALYZE = "analyze"
    TUNE = "tune"
    CHECK = "check"
    ATTACH = "attach"


class Sharding(StrEnum):
    """How FSDP shards a model (PyTorch's ``ShardingStrategy`` names, lower case). DeepSpeed's ZeRO stages map
    onto them: 0 ≈ NO_SHARD (DDP), 1/2 ≈ SHARD_GRAD_OP, 3 ≈ FULL_SHARD, 3 with ZeRO++ hpZ ≈ HYBRID_SHARD."""

    NO_SHARD = "no_shard"
    SHARD_GRAD_OP = "shard_grad_op"
    FULL_SHARD = "full_shard"
    HYBRID_SHARD = "hybrid_shard"
    HYBRID_SHARD_ZERO2 = "hybrid_shard_zero2"

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage whose memory this strategy has (within its shard group)."""
        return {"no_shard": 0, "shard_grad_op": 2, "hybrid_shard_zero2": 2}.get(self.value, 3)

    @property
    def hybrid(self) -> bool:
        """Shards inside a node and replicates across nodes."""
        return self in (Sharding.HYBRID_SHARD, Sharding.HYBRID_SHARD_ZERO2)

    @classmethod
    def parse(cls, value: object) -> Sharding | None:
        """A strategy from a config's words: ``FULL_SHARD``, ``full_shard auto_wrap``, ``ShardingStrategy.
        FULL_SHARD`` or Accelerate's numbers 1-5; None when nothing names one."""
        numbers = {
            1: "full_shard",
            2: "shard_grad_op",
            3: "no_shard",
            4: "hybrid_shard",
            5: "hybrid_shard_zero2",
        }
        if isinstance(value, bool):
            return None
        if isinstance(value, int):
            value = numbers.get(value)
        if isinstance(value, list | tuple):
            value = " ".join(str(v) for v in value)
        if not isinstance(value, str):
            return None
        text = value.strip()
        if text.isdecimal():  # not isdigit: '²' is a digit int() refuses
            return cls.parse(int(text))
        words = text.lower().replace("shardingstrategy.", "").replace(",", " ").split()
        for word in words:
            if word in cls._value2member_map_:
                return cls(word)
        return None


class Phase(StrEnum):
    """The parts of a training step's time; each member *is* the ``StepRecord`` field (seconds) it names, so a
    phase reads a step with ``getattr(step, phase)`` and keys JSON as before. DATA_WAIT, FORWARD, BACKWARD and
    OPTIMIZER are timed by the probe (``timed``); OTHER is what they leave of the step's wall time (evaluation,
    checkpoint saves, logging run there); the five add up to the step (``breakdown``). SYNC, the host blocked
    on the device, lies inside the others. Each renderer takes its words from here (``word``, ``label``,
    ``window_label``, ``noun``, ``where``); only colours stay with the renderers.

    GENERATE is the one phase only some runs have: the rollouts an online RL trainer (TRL's GRPO, RLOO, online DPO)
    generates inside its steps, carved out of what would otherwise be forward or other. Only a run that
    generates has it (``StepRecord.generate_s`` None elsewhere), so ``timed`` / ``breakdown`` name it only when
    asked (``generation=True``), after the data wait; a picture asks only where a step spent time in it."""

    DATA_WAIT = "data_wait_s"
    GENERATE = "generate_s"
    FORWARD = "forward_s"
    BACKWARD = "backward_s"
    OPTIMIZER = "optimizer_s"
    OTHER = "other_s"
    SYNC = "sync_s"

    @classmethod
    def timed(cls, generation: bool = False) -> tuple[Phase, ...]:
        """The four phases the probe times in every step; with ``generation`` (a run whose steps generate
        rollouts), five: GENERATE after the data wait."""
        if generation:
            return (cls.DATA_WAIT, cls.GENERATE, cls.FORWARD, cls.BACKWARD, cls.OPTIMIZER)
        return (cls.DATA_WAIT, cls.FORWARD, cls.BACKWARD, cls.OPTIMIZER)

    @classmethod
    def breakdown(cls, generation: bool = False) -> tuple[Phase, ...]:
        """The parts a step's wall time is split into: the timed ones and what they leave (OTHER)."""
        return (*cls.timed(generation), cls.OTHER)

    @property
    def word(self) -> str:
        """One word, where room is tight: the terminal's breakdown bar ("data")."""
        return _PHASE_WORDS[self].word

    @property
    def label(self) -> str:
        """Its name in a run's pictures of where a step's time goes ("data wait", "other")."""
        return _PHASE_WORDS[self].label

    @property
    def window_label(self) -> str:
        """Its name in the whole-run picture, window by window (OTHER: "between steps")."""
        return _PHASE_WORDS[self].window_label

    @property
    def noun(self) -> str:
        """What a sentence says grew ("time between steps went from 0.1 s to 0.3 s")."""
        return _PHASE_WORDS[self].noun

    @property
    def where(self) -> str:
        """Where time spent in it went, in a few words ("waiting for the DataLoader", "in backward")."""
        return _PHASE_WORDS[self].where

    @property
    def where_explained(self) -> str:
        """``where``, with what runs there when that is not plain from its name (a periodic stall's text)."""
        aside = _PHASE_WORDS[self].aside
        return f"{self.where} ({aside})" if aside else self.where


@dataclass(frozen=True)
class _Words:
    word: str
    label: str
    window_label: str
    noun: str
    where: str
    aside: str = ""


_PHASE_WORDS = {
    Phase.DATA_WAIT: _Words("data", "data wait", "data wait", "data wait", "waiting for the DataLoader"),
    Phase.GENERATE: _Words(
        "generate",
        "generation",
        "generation",
        "generation",
        "generating rollouts",
        "an online RL trainer's completions, sampled by generate() or vLLM before the training forward",
    ),
    Phase.FORWARD: _Words("forward", "forward", "forward", "forward", "in forward"),
    Phase.BACKWARD: _Words("backward", "backward", "backward", "backward", "in backward"),
    Phase.OPTIMIZER: _Words("optimizer", "optimizer", "optimizer", "optimizer", "in the optimizer step"),
    Phase.OTHER: _Words(
        "other",
        "other",
        "between steps",
        "time between steps",
        "between steps",
        "outside data, forward, backward and optimizer: evaluation, checkpoint saving or logging run there",
    ),
    Phase.SYNC: _Words(
        "sync", "synchronisation", "synchronisation", "synchronisation", "in host-device synchronisation"
    ),
}


class Evidence(StrEnum):
    """The kinds of evidence a cause's rule judges on (``@cause(needs=...)``): a report says which of them the
    inputs held and which they lacked, so "no finding" names what was checked (``diagnose/coverage.py``)."""

    STEPS = "steps"  # per-step timing: the probe's steps, a trace's step spans, attach's sampled steps
    GPU_UTILIZATION = (
        "gpu_utilization"  # how busy the GPU was: NVML, an nvidia-smi log, DCGM, a trace's kernels
    )
    GPU_ACTIVITY = "gpu_activity"  # hardware activity counters: SM / tensor / DRAM active (DCGM, GPM)
    GPU_MEMORY = "gpu_memory"  # memory used: the allocator's counters, an nvidia-smi or DCGM log
    TRACE_KERNELS = "trace_kernels"  # a profiler trace's GPU kernels and copies
    COLLECTIVES = "collectives"  # timed collectives (live) or a trace's NCCL / RCCL kernels
    ALL_RANKS = "all_ranks"  # every rank of a multi-rank job, to compare them
    LOADER_TIMING = "loader_timing"  # the DataLoader's waits: the probe's, a trace's DataLoader spans
    PROCESS = (
        "process"  # the job's own process watched from inside (the probe): its calls, settings, counters
    )
    SETTINGS = "settings"  # the job's settings: configs, TrainingArguments, the probe's environment
    GPU_CLOCKS = "gpu_clocks"  # the GPU's clocks and throttle reasons: NVML, an nvidia-smi log
    MODEL_SIZE = "model_size"  # the model's parameter count: the probe, a config.json (--model)
    EARLIER_RUN = "earlier_run"  # an earlier run of the same job in the history, to compare with

    @property
    def label(self) -> str:
        """The words a report names it by."""
        return _EVIDENCE_LABELS[self]


_EVIDENCE_LABELS = {
    Evidence.STEPS: "step timing",
    Evidence.GPU_UTILIZATION: "GPU utilization",
    Evidence.GPU_ACTIVITY: "GPU activity counters",
    Evidence.GPU_MEMORY: "GPU memory",
    Evidence.TRACE_KERNELS: "trace kernels",
    Evidence.COLLECTIVES: "collectives",
    Evidence.ALL_RANKS: "ranks",
    Evidence.LOADER_TIMING: "DataLoader timing",
    Evidence.PROCESS: "the job's process",
    Evidence.SETTINGS: "the job's settings",
    Evidence.GPU_CLOCKS: "GPU clocks",
    Evidence.MODEL_SIZE: "model size",
    Evidence.EARLIER_RUN: "earlier run",
}
