"""The RunProfile: what was measured about one training run, whatever the source.

A live probe, a callback and (later) an offline trace all fill these records. A field that a source
cannot know stays ``None``; nothing is guessed and written as if measured. Pure data: no torch here.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pitstop import schemas
from pitstop.core.vocabulary import Device, RuntimeApi, Source, StrEnum, Workload

T = TypeVar("T")


class CountSource(StrEnum):
    """Where a rank's rows and tokens were counted: the batches its DataLoader handed over, or the inputs of
    the training model's outermost forward (a loop that builds its own batches), or nowhere."""

    DATALOADER = "dataloader batch"
    MODEL_INPUTS = "model inputs"
    UNKNOWN = "unknown"


class StepBoundary(StrEnum):
    """What ended a step: the optimizer's ``step()``, or, where the job never calls it once per step
    (optimizer-in-backward, a hand-written update), the next forward of the outermost training module after
    its parameters changed."""

    OPTIMIZER_STEP = "optimizer step"
    MODEL_FORWARD = "model forward"


@dataclass
class StepRecord:
    """One optimizer step as seen by one process. Times in seconds."""

    index: int
    wall_s: float
    data_wait_s: float = 0.0
    forward_s: float | None = None
    backward_s: float | None = None
    optimizer_s: float | None = None
    micro_batches: int = 0
    samples: int | None = None
    tokens: int | None = None
    real_tokens: int | None = None
    loss_tokens: int | None = None
    examples: int | None = None  # examples in the step (several per row when packed)
    attended: int | None = None  # Σ L² over the step's examples: T = attended / real_tokens (plan.flops)
    packed_rows: int | None = None  # rows its examples need first-fit into rows of the padded width
    seq_len: int | None = None
    syncs: int | None = None
    sync_s: float | None = None
    h2d_bytes: int | None = None
    end_t: float | None = None  # host seconds since the probe started, at the optimizer step's end
    collectives: int | None = None  # torch.distributed collectives issued in the step (probe-timed)
    collective_bytes: int | None = None
    collective_blocked_s: float | None = None  # host time blocked inside blocking collectives
    # a collector's counts charged to this step (the rank's figure is their sum), so a window of steps has its
    # own (``wholerun/slicing.py``); None: none in this step, or not counted per step
    gc_pauses: GcPauses | None = None  # collections that ended in the step (generations only; steps 1 or 0)
    checkpoints: SaveStats | None = None  # saves the step waited for
    # seconds the step spent generating rollouts (an online RL trainer's generate() / vLLM calls), carved out of
    # the forward or other time they ran in; None: generation not watched (no generating trainer, other sources)
    generate_s: float | None = None

    @property
    def other_s(self) -> float | None:
        """Wall time not accounted for by data wait, generation, forward, backward and optimizer."""
        parts = (self.forward_s, self.backward_s, self.optimizer_s)
        if any(p is None for p in parts):
            return None
        timed = sum(p for p in parts if p is not None) + (self.generate_s or 0.0)
        return max(0.0, self.wall_s - self.data_wait_s - timed)


@dataclass
class GpuSample:
    """One NVML reading. Units: %, bytes, bytes/s, MHz, watts; t in seconds since the probe started."""

    t: float
    util: float | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    pcie_rx: float | None = None
    pcie_tx: float | None = None
    sm_clock: float | None = None
    power_w: float | None = None
    clock_reasons: int | None = None  # NVML clock-event (throttle) reasons bitmask
    # the SM application clock (MHz): what the GPU runs at when nothing holds it back
    app_clock: float | None = None


@dataclass
class ActivitySample:
    """One reading of a GPU's hardware activity counters (DCGM's profiling fields, NVML's GPM metrics).

    Ratios are fractions (0..1) of the sample period: ``sm_active`` the share of time at least one warp was
    resident on an SM (averaged over SMs), ``sm_occupancy`` resident warps over the maximum, ``tensor_active``
    the tensor pipes' busy share, ``dram_active`` the memory interface's busy share, ``gr_active`` the share in
    which the graphics/compute engine was busy at all (what utilization approximates). ``energy_j`` is the
    driver's cumulative energy counter (joules since the driver loaded), read as deltas only."""

    t: float
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    gr_active: float | None = None
    util: float | None = None  # % (DCGM_FI_DEV_GPU_UTIL: the same number nvidia-smi reports)
    power_w: float | None = None
    energy_j: float | None = None
    pcie_tx: float | None = None  # bytes/s
    pcie_rx: float | None = None
    nvlink_tx: float | None = None
    nvlink_rx: float | None = None


@dataclass
class GpuActivity:
    """One GPU's activity samples and where they came from; ``unsupported`` names the counters the source
    listed but could not read (N/A on this GPU or driver), so their absence is said, not guessed."""

    source: str  # "dcgmi dmon", "dcgm-exporter", "nvml gpm"
    gpu: str  # the GPU as the source named it ("0", a UUID)
    samples: list[ActivitySample] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)
    interval_s: float | None = None  # None: the source wrote no time; samples are then 1 apart by index
    timed: bool = False  # whether t comes from the source's clock


@dataclass
class HostSample:
    """One psutil reading of the trainer process and its children (DataLoader workers)."""

    t: float
    main_cpu_pct: float
    workers_cpu_pct: float
    workers: int


@dataclass
class DataLoaderInfo:
    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    batch_size: int | None = None
    collate_fn: str | None = None
    dataset: str | None = None
    examples_are_text: bool | None = None
    collate_s_per_batch: float | None = None
    # host-to-device copies the job made in the measured steps (Tensor.to / .cuda), by kind; None = not watched.
    # pin_memory=True overlaps nothing unless the copy also passes non_blocking=True.
    h2d_copies: int | None = None
    # pinned source, non_blocking=False: staged but still blocking
    h2d_copies_pinned_blocking: int | None = None
    h2d_copies_non_blocking: int | None = None
    # a tokenizer call of the job that padded every example to a fixed length (padding="max_length"), before
    # any collator: the length it padded to, the job's line ("path:line") and that line's code; None = not seen
    tokenizer_pads_to: int | None = None
    tokenizer_padding_site: str | None = None
    tokenizer_padding_code: str | None = None


@dataclass
class ModelInfo:
    """The model's shape and parameter counts: the one model-shape type of pitstop.

    The probe fills it from the model it watches (``probe/environment.py``), ingest and ``pitstop plan`` from
    a config.json (``plan/model_shape.py``); the FLOPs model, the memory model (``plan.memory.Setup.model``)
    and the rules read it. A fact a source cannot know stays ``None``; a dense model's expert fields are
    ``None``. The field names are the keys of a profile's ``environment.model``.
    """

    model_type: str | None = None
    n_layers: int | None = None
    hidden_size: int | None = None
    n_heads: int | None = None
    head_dim: int | None = None
    vocab_size: int | None = None
    intermediate_size: int | None = None
    n_kv_heads: int | None = None
    tied_embeddings: bool | None = None
    params_total: int | None = None
    params_trainable: int | None = None
    params_embedding: int | None = None
    n_experts: int | None = None  # mixture-of-experts: experts per layer, and how many a token is routed to
    experts_active: int | None = None
    params_inactive: int | None = None  # expert weights a token does not pass through: (E - k) / E of them
    library: str | None = None  # "transformers" when the trained model is a PreTrainedModel


@dataclass
class AttentionInfo:
    """Which attention path the run asked for and which ran (counted during warm-up)."""

    implementation: str | None = None
    sdpa_calls: int | None = None
    sdpa_calls_with_mask: int | None = None
    flash_attn_calls: int | None = None
    eager_calls: int | None = None


@dataclass
class AttentionTiming:
    """One layer's attention timed on the job's device after the window, at the job's shapes (forward and
    backward, seconds per micro-batch of ``rows``): the eager path against the fused SDPA kernel, so the
    speed-up of switching is measured where the job runs (``probe/collectors/attention_timing.py``)."""

    eager_s: float
    fused_s: float
    rows: int
    heads: int
    seq: int
    head_dim: int
    dtype: str
    rows_timed: int  # fewer than ``rows`` when one layer's scores would have been too large to time at once
    spread: TimingSpread | None = None  # eager over fused, timed in interleaved pairs (None: older profiles)


@dataclass(frozen=True)
class TimingSpread:
    """How far a comparison pitstop timed itself can be trusted (``probe/timing.py``): two paths timed in
    interleaved pairs until the per-pair ratios' interquartile range was small or time ran out; the median
    ratio (first path over second), its range, the pairs timed, and the machine's load meanwhile."""

    ratio: float
    ratio_low: float  # the per-pair ratios' lower quartile where stable, their lowest where not
    ratio_high: float  # their upper quartile where stable, their highest where not
    repeats: int  # pairs timed
    stable: bool  # the quartiles close enough (and, on a CPU, the machine not busy with other work)
    under_load: bool = False  # other processes kept a large share of this process's cores busy meanwhile
    others_cores: float | None = None  # cores other processes kept busy during the timing (/proc/stat)
    load_per_core: float | None = None  # the 1-minute load average over the cores this process may use
    cores: int | None = None  # the cores this process may use


@dataclass
class QuantizedBase:
    """A base model whose linears hold quantized weights (bitsandbytes 4 / 8-bit, torchao): every matmul
    dequantizes them again, forward and backward, the price of their smaller memory. The live probe counts
    the layers and times them against dense ones on the job's device (``probe/collectors/quantized.py``); a
    config (``quantization_config``, ``load_in_4bit``) says only the library, type and compute dtype."""

    library: str | None = None  # "bitsandbytes", "torchao"
    quant_type: str | None = None  # "nf4", "fp4", "int8", or a torchao tensor class
    bits: int | None = None
    double_quant: bool | None = None  # bitsandbytes' nested quantization of the 4-bit scales
    compute_dtype: str | None = None  # the dtype the dequantized weight is multiplied in
    layers: int | None = None  # quantized linears in the model
    params_quantized: int | None = None  # the real element count of their weights
    shapes: list[list[int]] = field(default_factory=list)  # distinct [out, in] weight shapes
    set_by: str | None = None  # where it was read: "config.json quantization_config", "the model's linears"
    # timed after the window on the job's device (forward and backward of the input gradient, at its tokens)
    timed_on: str | None = None  # "cpu", "cuda (NVIDIA H100 80GB HBM3)"
    tokens_timed: int | None = None  # tokens per micro-batch the layers were timed at
    quantized_s: float | None = None  # every quantized layer once, per micro-batch, as the job runs them
    dense_s: float | None = None  # the same layers as dense linears in the compute dtype
    dequant_s: float | None = None  # the weights' dequantization alone (4-bit), per micro-batch
    passes: int | None = None  # dequantizations per layer per micro-batch: 2, 3 with activation checkpointing
    micro_batches: int | None = None  # micro-batches per optimizer step
    dequant_s_per_step: float | None = None  # (quantized − dense) × micro-batches: what dense weights save
    spread: TimingSpread | None = None  # quantized over dense linears, timed in interleaved pairs


@dataclass
class CpuThreads:
    """Threads the job runs against the cores it may use (read at the first step), and how many of the
    job's threads were runnable during the window (sampled from /proc: OpenMP threads that spin count)."""

    cores_allowed: int | None = None  # affinity and cgroup quota applied
    machine_cores: int | None = None
    cgroup_cores: float | None = None
    torch_threads: int | None = None  # torch.get_num_threads() of the training process
    interop_threads: int | None = None
    omp_num_threads: str | None = None  # $OMP_NUM_THREADS as the job saw it; None: unset
    local_ranks: int | None = None  # training processes on this machine
    launcher: str | None = None  # "torchrun" when torch elastic started the job
    runnable_threads: float | None = None  # mean runnable threads of the process and its children
    machine_run_queue: float | None = None  # mean runnable threads of the whole machine (/proc/stat)
    steal_frac: float | None = None  # share of CPU time the hypervisor took (psutil)


class LinkPath(StrEnum):
    """The path between two GPUs of one node, in ``nvidia-smi topo -m``'s words (its legend)."""

    NVLINK = "NV"  # a bonded set of NVLinks (topo -m's NV#; the count is GpuPair.nvlinks)
    PIX = "PIX"  # at most one PCIe bridge
    PXB = "PXB"  # several PCIe bridges, no host bridge
    PHB = "PHB"  # through a PCIe host bridge (the CPU)
    NODE = "NODE"  # between PCIe host bridges inside one NUMA node
    SYS = "SYS"  # across the SMP interconnect between NUMA nodes (QPI / UPI): another CPU socket


@dataclass
class GpuLinks:
    """One GPU's own links (NVML, ``nvidia-smi nvlink -s``); None where the source did not read it."""

    index: int
    name: str | None = None
    nvlinks_active: int | None = None
    nvlinks_inactive: int | None = None  # links the GPU has that are down (a fault on an NVLink part)
    nvlink_gbps: float | None = None  # one active link's rate, one direction, as nvidia-smi prints it
    pcie_gen: int | None = None  # the generation the link runs at when read
    pcie_gen_max: int | None = None  # the most card and slot can run
    pcie_width: int | None = None  # lanes running
    pcie_width_max: int | None = None
    pcie_read_busy: bool | None = None  # read while the job trained (an idle GPU drops its PCIe generation)


@dataclass
class GpuPair:
    """The path between two GPUs of one node (``nvidia-smi topo -m``, NVML's common ancestor)."""

    a: int
    b: int
    path: LinkPath
    nvlinks: int | None = None  # bonded NVLinks between the two (topo -m's NV#)
    p2p: bool | None = None  # NVML's P2P read status between the two; None: not read


@dataclass
class Topology:
    """How the job's GPUs and nodes are linked, from where that is written: NVML, ``nvidia-smi topo -m`` /
    ``nvlink -s``, NCCL's own init log (``NCCL_DEBUG=INFO``). A measured link beats an assumed one."""

    sources: list[str] = field(default_factory=list)  # "nvidia-smi topo -m", "nvml", "nccl log", ...
    gpus: list[GpuLinks] = field(default_factory=list)
    pairs: list[GpuPair] = field(default_factory=list)
    nics: list[str] = field(default_factory=list)  # RDMA / network devices (topo -m's NIC legend, NCCL's NET)
    # NCCL's transports inside a node: P2P/CUMEM, SHM, ...
    nccl_intra: list[str] = field(default_factory=list)
    nccl_inter: list[str] = field(default_factory=list)  # between nodes: NET/IB, NET/Socket
    nccl_net: str | None = None  # the network NCCL chose: "IB", "Socket", or a plugin's name
    nccl_nodes: int | None = None  # hosts in NCCL's communicator
    nccl_ranks: int | None = None
    nccl_version: str | None = None


@dataclass
class KernelFacts:
    """Which fused paths the run uses: the optimizer's implementation, Liger Kernel, torch.compile."""

    optimizer: str | None = None  # the optimizer's class name
    optimizer_fused: bool | None = None
    optimizer_foreach: bool | None = None  # as torch resolves it (None in the constructor = its default)
    liger_installed: bool | None = None
    liger_applied: bool | None = None  # some module or forward of the model comes from liger_kernel
    compiled: bool | None = None  # the model (or the Trainer's) is torch.compile'd


@dataclass
class Environment:
    device: Device | None = None
    gpu_name: str | None = None
    gpu_count: int | None = None  # the GPUs the process sees
    gpus_held: int | None = None  # the GPUs the model's parameters and buffers lie on (>1 under a device map)
    gpu_memory_bytes: int | None = None
    cpu_count: int | None = None
    hostname: str | None = None
    framework: str | None = None  # "pytorch", "hf_trainer", "trl", "accelerate", "lightning", "deepspeed"
    attention: AttentionInfo = field(default_factory=AttentionInfo)
    param_dtype: str | None = None
    autocast_dtype: str | None = None
    tf32: bool | None = None
    gradient_checkpointing: bool | None = None
    model: ModelInfo = field(default_factory=ModelInfo)
    dataloader: DataLoaderInfo = field(default_factory=DataLoaderInfo)
    micro_batch_size: int | None = None
    grad_accum_steps: int | None = None
    zero_stage: int | None = None
    zero_hpz: int | None = None  # DeepSpeed ZeRO++ zero_hpz_partition_size (1: no secondary partition)
    # FSDP's ShardingStrategy (vocabulary.Sharding) when FSDP shards the model
    fsdp_sharding: str | None = None
    offload: dict[str, str] | None = None  # {"optimizer": "cpu", "param": "nvme"}; {} when known to be off
    world_size: int | None = None
    versions: dict[str, str] = field(default_factory=dict)
    dist_backend: str | None = None  # "gloo", "nccl", ... (torch.distributed's default group)
    nodes: int | None = None  # hosts the job's ranks ran on
    comm_env: dict[str, str] | None = None  # NCCL_* / GLOO_* settings that change the transport
    links: Topology | None = None  # how the GPUs and nodes are linked (NVML, nvidia-smi, NCCL's log)
    # settings read from configs (pitstop analyze / check); None where no source said
    packing: bool | None = None
    group_by_length: bool | None = None
    max_seq_len: int | None = None
    eval_steps: int | None = None
    save_steps: int | None = None
    logging_steps: int | None = None
    torch_compile: bool | None = None
    compile_dynamic: bool | None = None  # torch.compile's dynamic= as configured (None: left to torch)
    ddp_find_unused_parameters: bool | None = None  # as the run resolves it (the Trainer's None: its default)
    experts_implementation: str | None = None  # a config's experts_implementation ("eager")
    checkpoint_reentrant: bool | None = None  # activation checkpointing's use_reentrant, as it runs
    anomaly_detection: bool | None = None  # a config switches autograd's anomaly detection on (Lightning)
    metric_sync_per_step: list[str] | None = None  # configured cross-rank gathers for metrics every step
    empty_cache_steps: int | None = None  # the Trainer's torch_empty_cache_steps (empty_cache every N steps)
    rl: RlSettings | None = None  # an online RL trainer's rollout settings (live: its args; or a config's)
    # the run's length (diagnose/savings.py): optimizer steps the whole run is meant to take, who said so
    # ("the Trainer's max_steps", "trainer_state.json max_steps"), and the run's own step count minus the
    # probe's step index (a resumed run's steps before this process; 0 for a fresh one)
    total_steps: int | None = None
    total_steps_from: str | None = None
    step_offset: int | None = None
    cpu: CpuThreads | None = None  # thread counts and CPU load (live probe only)
    kernels: KernelFacts | None = None  # fused optimizer / loss / norms (live probe only)
    config_sources: list[str] = field(default_factory=list)
    # a configured fact -> the setting that says it, for a finding's evidence (pitstop check / analyze):
    # {"ddp_find_unused_parameters": "args.json: ddp_find_unused_parameters unset: the Trainer's default ..."}
    configured_by: dict[str, str] = field(default_factory=dict)
    quantized_base: QuantizedBase | None = None  # a config's quantization_config / load_in_4bit

    @property
    def on_gpu(self) -> bool:
        return self.device in (Device.CUDA, Device.ROCM)

    @property
    def attn_implementation(self) -> str | None:
        return self.attention.implementation


@dataclass
class MemoryStats:
    """torch.cuda memory statistics at the end of the window."""

    peak_allocated: int | None = None
    peak_reserved: int | None = None
    alloc_retries: int | None = None
    ooms: int | None = None
    # the caching allocator during the measured window (``torch.cuda.memory_stats`` read at each step's end)
    window_steps: int | None = None
    window_alloc_retries: int | None = None  # the allocator freed its cache and retried a cudaMalloc
    window_device_allocs: int | None = None  # cudaMalloc calls
    window_device_frees: int | None = None  # cudaFree calls
    steps_with_device_allocs: int | None = None
    reserved_mean: float | None = None  # bytes reserved by the allocator, mean over the steps
    allocated_mean: float | None = None  # bytes in live tensors, mean over the steps
    inactive_split_mean: float | None = None  # bytes free inside split blocks (fragmentation)


@dataclass
class SaveStats:
    """Checkpoint saves that ran inside the measured window (torch.save, save_pretrained, a trainer's save),
    counted once per outermost call; ``calls`` by what was called; ``steps_with_saves``: steps that saved
    anything (one checkpoint is often several calls: the model, then the optimizer)."""

    saves: int = 0
    save_s: float = 0.0
    steps_with_saves: int = 0
    calls: dict[str, int] = field(default_factory=dict)


@dataclass
class GcGeneration:
    """Python's cyclic garbage collector, one generation, in the measured window (timed by a ``gc.callbacks``
    callback: every collection of the process, automatic or by hand, stalls the loop while it runs)."""

    collections: int = 0
    pause_s: float = 0.0  # total time inside its collections
    longest_s: float = 0.0  # the longest single collection
    collected: int = 0  # unreachable objects it found (freed or uncollectable)
    steps: int = 0  # measured steps in which it ran at least once


def _three_generations() -> list[GcGeneration]:
    return [GcGeneration() for _ in range(3)]


@dataclass
class GcPauses:
    """The cyclic garbage collector in the measured window, per generation (0 the youngest, 2 the full
    collection that traverses every tracked object not frozen), and how the job had set it up."""

    generations: list[GcGeneration] = field(default_factory=_three_generations)
    enabled: bool | None = None  # gc.isenabled() at the window's start (False: the job collects by hand)
    thresholds: list[int] | None = None  # gc.get_threshold() at the window's start
    frozen: int | None = None  # gc.get_freeze_count() after the window: objects gc.freeze() took out
    tracked: int | None = None  # objects a full collection traverses (tracked, not frozen), after the window
    # the same counts for the collections the interpreter started itself, without those an explicit gc.collect()
    # ran (the job's or a library's: their time is per_step_cleanup's, timed as calls); None: not told apart
    automatic: list[GcGeneration] | None = None

    @property
    def pause_s(self) -> float:
        return sum(g.pause_s for g in self.generations)


def json_key(key: str) -> dict[str, str]:
    """A field's metadata naming its JSON key, where that is not the field's name (a key with a space)."""
    return {"json": key}


@dataclass
class StepCategories:
    """The TensorBoard plugin's Overview of a step, ms per step: each moment of the step counted once, for the
    first category that covers it in this order (``trace/overview.py``). The JSON keys are the plugin's
    category names ("Kernel", "CPU Exec")."""

    kernel: float = field(default=0.0, metadata=json_key("Kernel"))
    memcpy: float = field(default=0.0, metadata=json_key("Memcpy"))
    memset: float = field(default=0.0, metadata=json_key("Memset"))
    communication: float = field(default=0.0, metadata=json_key("Communication"))
    runtime: float = field(default=0.0, metadata=json_key("Runtime"))
    dataloader: float = field(default=0.0, metadata=json_key("DataLoader"))
    cpu_exec: float = field(default=0.0, metadata=json_key("CPU Exec"))
    other: float = field(default=0.0, metadata=json_key("Other"))

    def by_name(self) -> dict[str, float]:
        """ms per step under the plugin's category names, in its order."""
        return {key: getattr(self, name) for name, key in json_keys(StepCategories)}


@dataclass
class GpuTime:
    """Holistic Trace Analysis's temporal breakdown: shares of the span from the first to the last GPU event
    that the GPU sat idle, ran compute kernels, and ran anything else (communication, copies, sets)."""

    idle: float = 0.0
    compute: float = 0.0
    non_compute: float = 0.0


@dataclass
class IdleSplit:
    """Why the GPU sat idle, as shares of its idle time (HTA's): waiting for the host to launch, the gap
    between back-to-back kernels, anything else."""

    host_wait: float = 0.0
    kernel_wait: float = 0.0
    other: float = 0.0


@dataclass
class DebugModes:
    """Debug and safety modes left on in the job, as the live probe saw them: each makes every step slower."""

    anomaly_steps: int = 0  # measured steps during which autograd's anomaly detection was on
    anomaly_site: str | None = None  # "file:line" of the job's call that switched it on, where it was seen
    settings: list[str] = field(default_factory=list)  # others on: "CUDA_LAUNCH_BLOCKING=1", ...
    profilers: list[str] = field(default_factory=list)  # profilers and tracers running as the window started


@dataclass
class Checkpointing:
    """Activation checkpointing as the live probe saw it run in the measured steps: which variant, and the
    parameter all-gathers the reentrant variant repeats where its recompute runs a whole FSDP unit."""

    reentrant: int = 0  # checkpointed calls that ran the reentrant variant (use_reentrant=True or left unset)
    non_reentrant: int = 0  # checkpointed calls that ran the non-reentrant variant
    # all-gathers those reentrant recomputes repeat in the backward: an FSDP1 unit (FULL_SHARD / HYBRID_SHARD)
    # whose forward runs inside the checkpoint, an FSDP2 unit's forward prefetches run again by its recompute
    regathers: int = 0
    site: str | None = None  # the line that called torch.utils.checkpoint.checkpoint for a reentrant call


@dataclass
class DdpSettings:
    """How DistributedDataParallel wraps the model, as the live probe read it from the wrapper: the settings
    that cost every step when the model does not need them."""

    find_unused_parameters: bool | None = None  # DDP searches the autograd graph for unused parameters
    static_graph: bool | None = None
    parameters: int | None = None  # parameters that need a gradient
    unused_parameters: int | None = None  # of those, got no gradient in any measured step (None: not counted)
    # who asked for the search: "the Trainer's default (ddp_find_unused_parameters=None)"
    set_by: str | None = None
    site: str | None = None  # "file:line" of the job's line that built the wrapper, where it was seen
    unused_names: list[str] = field(default_factory=list)  # the first few of those unused parameters, by name
    # host seconds DDP spent in its post-forward graph search in the measured steps
    search_s: float | None = None
    searches: int = 0  # forwards in the measured steps after which DDP searched the graph


@dataclass
class ExpertsInfo:
    """A mixture-of-experts model's expert layers as the live probe saw them run
    (``probe/collectors/experts.py``): the implementation in use, whether it loops over the experts one after
    another, and the experts' share of the measured steps (forward and backward, timed around the expert
    modules); at the window's end one layer's loop and grouped GEMM timed at the job's shapes."""

    layers: int = 0  # expert modules (one per MoE layer) found in the model
    experts: int | None = None  # experts per layer
    experts_per_token: int | None = None  # top-k: the experts a token is routed to
    # "eager", "grouped_mm", "batched_mm", ... (Transformers' config._experts_implementation), or "loop": an
    # nn.ModuleList of experts the block's own forward loops over (Transformers < 5, remote code, your own)
    implementation: str | None = None
    available: list[str] = field(default_factory=list)  # implementations the model can switch to
    fallback: str | None = None  # why "grouped_mm" runs Transformers' per-expert loop here (old torch, GPU)
    site: str | None = None  # the expert module's class and module: "MixtralExperts (transformers...)"
    library: str | None = None  # "transformers" when Transformers dispatches the experts
    transformers_version: str | None = None
    calls: int = 0  # expert-module forwards in the measured steps (recomputed ones not counted)
    forward_s: float | None = None  # their forward time in the measured steps (device time on a GPU)
    backward_s: float | None = None  # from each output's gradient to the input's (None: not paired)
    backward_calls: int = 0  # forwards whose backward was timed (the rest are scaled from these)
    experts_s: float | None = None  # forward + backward: the experts' time in the measured steps
    recomputed: int = 0  # forwards run again inside the backward (activation checkpointing)
    tokens_per_call: int | None = None  # tokens routed into one expert module per call (the job's shape)
    # one expert module's loop and grouped GEMM, forward and backward, timed after the window at the job's
    # tokens on its device (seconds per call), where the model dispatches through Transformers
    loop_s: float | None = None
    grouped_s: float | None = None
    timed_tokens: int | None = None
    timed_dtype: str | None = None
    switch_spread: TimingSpread | None = None  # the loop over grouped_mm, timed in interleaved pairs


@dataclass
class ShardingStats:
    """The sharding framework (FSDP1, FSDP2, DeepSpeed ZeRO) as the live probe saw it: the model's parameter
    tensors it shards one by one or unit by unit, and the host time its hooks took in the measured steps (what
    a full replica under DDP would not spend), so its overhead is set against DDP's one bucketed all-reduce."""

    framework: str  # "fsdp1", "fsdp2", "deepspeed"
    strategy: str | None = None  # a vocabulary.Sharding word, or "zero1" / "zero2" / "zero3" for DeepSpeed
    # FSDP units (wrapped modules) or ZeRO-3 modules with fetch hooks; None: not counted
    units: int | None = None
    param_tensors: int = 0  # the model's parameter tensors, unsharded (FSDP1's flat parameters unpacked)
    small_tensors: int = 0  # of those, under ``small_elements`` elements (norms, biases)
    small_elements: int = 0  # the size under which a tensor counted as small
    param_bytes: int = 0  # every parameter, unsharded, in its dtype
    grad_bytes: int = 0  # the trainable ones: what DDP would all-reduce each step
    # host seconds inside the framework's hooks in the measured steps (None: unseen)
    hook_s: float | None = None
    hook_calls: int = 0
    steps: int = 0  # measured steps the hooks were timed over
    # memory one rank may use: its GPU's, or on a CPU the host's over local ranks
    memory_bytes: int | None = None


@dataclass
class RlSettings:
    """An online RL trainer's rollout settings (TRL's GRPOConfig / RLOOConfig / OnlineDPOConfig fields as the run
    resolved them): what sizes the generation inside each step. None where the source did not say."""

    trainer: str | None = None  # the trainer's class ("GRPOTrainer"); None where only a config was read
    use_vllm: bool | None = None
    vllm_mode: str | None = None  # "colocate" or "server" (meaningful with use_vllm)
    vllm_gpu_memory_utilization: float | None = None
    continuous_batching: bool | None = None  # use_transformers_continuous_batching (or _paged)
    num_generations: int | None = None  # completions sampled per prompt
    generation_batch_size: int | None = None  # completions generated at once
    steps_per_generation: int | None = None  # optimizer steps one generation batch feeds
    num_iterations: int | None = None  # updates per generation batch
    max_completion_length: int | None = None  # online DPO's max_new_tokens


@dataclass
class GenerationStats:
    """Rollout generation the live probe timed in the measured steps: the outermost generate() / vLLM calls on
    the training thread (nested ones count once), their host time and what they produced."""

    calls: int = 0
    steps_generating: int = 0  # measured steps with at least one call
    seconds: float = 0.0  # host seconds inside the calls
    sequences: int | None = 0  # completions returned (None: some call's output could not be read)
    tokens: int | None = 0  # completion tokens returned (generate(): its padded width × rows)
    calls_by: dict[str, int] = field(default_factory=dict)  # "transformers generate": 8, "vLLM generate": ...


@dataclass
class CompileStats:
    """torch.compile in the measured window, from torch._dynamo's counters: compiling is meant to happen once;
    a recompile on every new shape (or eager after the cache limit) costs the job every such step."""

    compiled_frames: int = 0  # frames compiled in the window (first compiles and recompiles)
    recompiles: int = 0  # of those, a frame compiled again (a guard failed: a new shape, a new value)
    graph_breaks: int = 0  # found since the job started (a break is found when its frame compiles)
    compile_s: float = 0.0  # host seconds the window spent compiling
    steps_compiling: int = 0  # measured steps that compiled anything
    cache_limit_hit: bool = False  # a frame reached the recompile limit: it runs eagerly from there on
    reasons: list[str] = field(default_factory=list)  # the commonest guard failures, most frequent first
    dynamic: bool | None = None  # the ``dynamic=`` the job passed to torch.compile (None: left to torch)
    site: str | None = None  # the job's line that called torch.compile ("train.py:42")
    recompile_limit: int | None = None  # torch._dynamo.config.recompile_limit as the job ran
    limit_frame: str | None = None  # the function that hit the limit: "'forward' (modeling_llama.py:400)"
    compiles_before_window: int = 0  # frames compiled from the probe's start to the window (warm-up)
    compiling_steps: list[int] = field(default_factory=list)  # indices of the measured steps that compiled


@dataclass
class JobCall:
    """A cleanup call made during the measured steps (``gc.collect``, ``torch.cuda.empty_cache``), grouped by
    where it came from: the job's own line, or a library's line (``via``) on a setting of the job's."""

    call: str  # "gc.collect", "torch.cuda.empty_cache"
    site: str  # the job's line that made it, or under which a library made it: "path/train.py:123 in step"
    count: int = 0
    steps: int = 0  # measured steps it was called in
    seconds: float = 0.0  # host time inside the call
    via: str | None = None  # the library's line that made the call, when not the job's own
    setting: str | None = None  # what made the library call: "TrainingArguments(torch_empty_cache_steps=1)"
    collected: int = 0  # gc.collect: the unreachable objects its collections found (its return values)


@dataclass
class TraceBatch:
    """The batch a traced step ran, read from the operators' recorded shapes (trace/shapes.py), and how its
    kernels would scale with it. Times are per step, in ms."""

    samples: int | None = None  # the leading dimension of the model's first layer's input
    tokens: int | None = None  # token ids per forward, where the first layer is an embedding
    forwards_per_step: int = 1  # calls of that layer per step (gradient accumulation, several micro-batches)
    input_op: str | None = None  # the operator it was read from ("aten::linear")
    weight_dims: list[int] = field(default_factory=list)  # that layer's weight shape
    agreeing: float | None = None  # share of its calls in the steps with this leading dimension
    gemm_gflop: float | None = None  # GEMM FLOPs per step from the shapes (convolutions not counted)
    kernel_ms: float | None = None  # compute kernels' time, summed
    kernel_floor_ms: float | None = None  # the part of it under each kernel's latency floor
    floor_us: float = 5.0  # the latency floor taken per kernel (trace/shapes.py's KERNEL_FLOOR_US)
    kernels_per_step: float | None = None
    h2d_ms: float | None = None  # host-to-device copies' time


@dataclass
class RuntimeCall:
    """One CUDA / HIP runtime call's time in a trace's steps: what the host spent in it and what the GPU did
    meanwhile (a host blocked while the GPU idles is time lost; while it computes, hidden)."""

    name: str  # "hipFree", "cudaStreamSynchronize"
    kind: RuntimeApi
    calls_per_step: float = 0.0
    ms_per_step: float = 0.0  # union of its calls (over threads) inside the steps, per step
    frac_of_step: float = 0.0  # share of the host timeline (the steps' wall time)
    gpu_busy_frac: float | None = None  # share of its time the GPU was busy (kernels, copies, sets)


@dataclass
class TraceStats:
    """What only a profiler trace of one rank says; what a live run measures too (each step's time and data
    wait, its host syncs) is in the rank's ``steps``. Times are per step, in ms, unless named otherwise;
    fractions are of the mean step time (``RankProfile.mean_step_s``)."""

    breakdown_ms: StepCategories | None = None  # None: the trace has no steps
    gpu_util: float | None = None  # kernel-busy share of step time (union over streams)
    temporal: GpuTime | None = None  # None: no GPU events
    idle_split: IdleSplit | None = None
    kernels_per_step: float | None = None
    tiny_kernel_frac: float | None = None  # kernels shorter than 10 us, share of kernel count
    launch_bound: bool | None = None
    h2d_pageable_mb: float | None = None
    h2d_pinned_mb: float | None = None
    gemm_ms: float | None = None
    fp32_gemm_frac: float | None = None  # share of GEMM kernel time in plain fp32 (sgemm-type) kernels
    tf32_gemm_frac: float | None = None  # share in TF32 tensor-core kernels
    low_precision_gemm_frac: float | None = None  # share in bf16 / fp16 tensor-core kernels
    attention_path: str | None = None  # flash, mem_efficient, math, eager, unknown
    nccl_ms: float | None = None
    nccl_overlap_frac: float | None = None  # share of NCCL time that overlaps compute kernels
    dataloader_multiprocess: bool | None = None
    limitations: list[str] = field(default_factory=list)
    # across ranks (pitstop analyze on several traces: clocks aligned on the ends of matching collectives)
    host_wait_ms: float | None = None  # GPU idle while waiting for the host to launch (HTA's host wait)
    collectives: int | None = None  # NCCL / RCCL kernels matched with other ranks
    clock_offset_us: float | None = None  # this rank's clock minus the reference rank's
    arrival_skew_ms: float | None = None  # mean spread of arrivals (last - first) at its collectives
    arrival_late_ms: float | None = None  # mean of how much later than the median rank it arrives
    last_arrival_frac: float | None = None  # share of its collectives at which it arrived last
    collective_wait_ms: float | None = None  # per step, time its collectives waited for the last rank
    exposed_comm_ms: float | None = None  # per step, collective time not hidden by compute nor waiting
    bus_bandwidth_gbps: float | None = None  # NCCL-tests "bus bandwidth" from the time after the last arrival
    # how the steps were found: "ProfilerStep#N spans", or trace/steps.py's words for the markers it read
    steps_from: str | None = None
    workload: Workload | None = None  # training or inference (None: the trace does not say, no CPU operators)
    gpu_busy_frac: float | None = None  # union of all GPU work (kernels, copies, sets) over the steps' time
    runtime_calls: list[RuntimeCall] = field(
        default_factory=list
    )  # the runtime calls that took the most time
    batch: TraceBatch | None = None  # from the recorded shapes; None: recorded without them


@dataclass
class RunTotals:
    """Whole-run figures from artifacts that have no per-step records (trainer_state.json, results files)."""

    train_s: float | None = None  # train_runtime as the Trainer measured it (includes evaluation)
    steps: int | None = None
    samples_per_s: float | None = None
    tokens: int | None = None  # tokens seen (num_input_tokens_seen / num_tokens), padding included or not
    hf_total_flos: float | None = None  # the Trainer's 6·N·tokens count, summed over processes
    eval_s: float | None = None
    evals: int | None = None
    saves: int | None = None
    n_gpus: int | None = None


@dataclass
class SyncSite:
    """One call site that blocked the host on the GPU during the measured steps."""

    site: str  # "file.py:123 in function"
    kind: str  # item, tolist, cpu, bool, float, int, nonzero, copy_to_device, synchronize, other
    count: int = 0
    seconds: float | None = None  # host time blocked, where the call could be timed; None = counted only


@dataclass
class JobFailure:
    """How a job failed: its exit as the runner saw it (a code, or the signal that killed it) and the uncaught
    exception a process of it raised, as the probe recorded it (type, message, the innermost line of the job's
    own code, the step). A rank holds only its exception; the run holds the whole failure."""

    exit_code: int | None = None  # the job's own exit code; None: killed by a signal, or not known
    signal: str | None = None  # the signal that killed it ("SIGKILL"); None: it exited by itself
    exception: str | None = None  # the exception's type ("RuntimeError"); None: none was recorded
    message: str | None = None  # its message (cut short when long)
    site: str | None = None  # "path:line" of the innermost frame in the job's own code (not a library's)
    step: int | None = None  # the optimizer step it ended (1-based); None: before the first step
    rank: int | None = None  # the process that raised it
    thread: str | None = None  # the thread that raised it, when not the main one
    at: float | None = None  # Unix time it was raised: of several ranks, the first is the cause

    def describe(self) -> str:
        """The exception in one line ("RuntimeError: the callback failed (train.py:78)"), else the exit."""
        if self.exception is None:
            if self.signal is not None:
                return f"killed by {self.signal}"
            return f"exit code {self.exit_code}" if self.exit_code is not None else "failed"
        first_line = (self.message or "").strip().splitlines()[0:1]
        said = f"{self.exception}: {first_line[0]}" if first_line else self.exception
        if not self.site:
            return said
        file, _, line = self.site.rpartition(":")
        return f"{said} ({Path(file).name}:{line})" if file else f"{said} ({self.site})"


@dataclass
class CollectiveRecord:
    """One torch.distributed collective as one rank saw it. Times are seconds on the rank's own clock
    (host seconds since the probe started, or device seconds since the rank's first CUDA event); ranks are
    compared only after aligning their clocks on collective ends (pitstop.diagnose.ranks)."""

    step: int  # index of the optimizer step it was issued in
    op: str  # all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, barrier, ...
    group: str  # the global ranks of its process group, "0,1,2,3"
    seq: int  # its position among this group's collectives on this rank (the same collective on every rank)
    bytes: int
    size: int  # ranks in the group
    issued_t: float  # when this rank arrived (called it, or its stream reached it)
    done_t: float | None = None  # when it completed on this rank
    blocked_s: float | None = None  # host time blocked in the call (None: asynchronous)
    source: str = "python"  # "python" (a torch.distributed call) or "ddp" (DDP's gradient buckets)
    clock: str = "host"  # "host" or "device"
    # a python collective issued outside backward: the line that issued it, past the libraries that only relay
    # it (accelerate, Lightning, torchmetrics): the job's, or a library's ("transformers/trainer.py:2792 in
    # Trainer._track_num_input_tokens"); None inside backward, for DDP's, and for torch's or DeepSpeed's own
    site: str | None = None
    via: str | None = None  # the relaying library call that line made ("lightning:LightningModule.log")


@dataclass
class RankProfile:
    """Everything one process measured."""

    rank: int = 0
    local_rank: int = 0
    pid: int | None = None
    hostname: str | None = None
    warmup_steps: int = 0
    steps: list[StepRecord] = field(default_factory=list)
    gpu_samples: list[GpuSample] = field(default_factory=list)
    host_samples: list[HostSample] = field(default_factory=list)
    window_start_t: float | None = None
    window_end_t: float | None = None
    memory: MemoryStats = field(default_factory=MemoryStats)
    environment: Environment = field(default_factory=Environment)
    trace: TraceStats | None = None
    checkpoints: SaveStats | None = None  # None: not watched (an offline source)
    gc_pauses: GcPauses | None = None  # None: not watched (an offline source, attach's stack samples)
    debug_modes: DebugModes | None = None  # None: not watched (an offline source)
    checkpointing: Checkpointing | None = None  # None: not watched, or no checkpointed call seen
    ddp: DdpSettings | None = None  # None: not wrapped in DDP, or not watched
    compile: CompileStats | None = None  # None: torch.compile not used, or not watched
    sharding: ShardingStats | None = None  # None: no FSDP / ZeRO seen, or not watched
    job_calls: list[JobCall] | None = None  # None: not watched (an offline source)
    stopped_by_probe: bool = False
    probe_errors: list[str] = field(default_factory=list)
    window_rule: str | None = None  # why an adaptive window ended ("12 steps: mean step time known to ±2.1%")
    sync_sites: list[SyncSite] = field(
        default_factory=list
    )  # where the host waited on the GPU, busiest first
    collectives: list[CollectiveRecord] = field(default_factory=list)
    world_rank0_host: str | None = None  # the node that holds global rank 0 (multi-node gather)
    tokens_counted_from: CountSource | None = None  # None: an older or offline source that does not say
    steps_delimited_by: StepBoundary | None = None
    step_boundary_reason: str | None = None  # why steps were not delimited by the optimizer, when not
    gpu_activity: GpuActivity | None = None  # hardware activity counters of this rank's GPU, when read
    attention_timing: AttentionTiming | None = None  # eager vs fused attention timed after the window
    generation: GenerationStats | None = None  # None: generation not watched (no generating trainer or call)
    quantized_base: QuantizedBase | None = None  # None: no quantized linear seen, or not watched
    experts: ExpertsInfo | None = None  # None: no expert layers seen, or not watched
    failure: JobFailure | None = None  # the uncaught exception this process raised; None: none seen

    def total(self, name: str) -> float | None:
        """Sum of one StepRecord field over the measured steps (None if any step lacks it)."""
        values = [getattr(s, name) for s in self.steps]
        if not values or any(v is None for v in values):
            return None
        return float(sum(values))

    @property
    def wall_s(self) -> float:
        return sum(s.wall_s for s in self.steps)

    @property
    def gpus_held(self) -> int:
        """The GPUs this process's model lies on, one where that was not recorded."""
        return max(self.environment.gpus_held or 1, 1)

    @property
    def median_step_s(self) -> float | None:
        return statistics.median(s.wall_s for s in self.steps) if self.steps else None

    @property
    def mean_step_s(self) -> float | None:
        return self.wall_s / len(self.steps) if self.steps else None


@dataclass
class HistoryRun:
    """A run as the history keeps it, for comparing a run with an earlier one of the same workload (the history
    layer fills ``RunProfile.baseline``; the library_upgrade rule reads it): which run, when, the library
    versions it ran with, its speed, its measured spread and where its step's time went."""

    run_id: int | None = None  # the history's id; None for a run not (yet) recorded
    created_at: str | None = None
    label: str | None = None
    kind: str | None = None  # doctor, tune, analyze, ...
    versions: dict[str, str] = field(default_factory=dict)  # package -> version, as recorded
    real_tokens_per_s: float | None = None
    step_time_s: float | None = None
    throughput_spread: float | None = None  # relative standard error of real tokens/s
    phase_s: dict[str, float] = field(default_factory=dict)  # Phase value -> seconds per step


@dataclass
class RunProfile:
    """One training run: per-rank measurements plus what is known about how it was launched."""

    source: Source  # what measured it or read it
    ranks: list[RankProfile] = field(default_factory=list)
    command: list[str] | None = None
    started_at: str | None = None
    requested_steps: int | None = None
    exit_code: int | None = None
    notes: list[str] = field(default_factory=list)
    totals: RunTotals | None = None
    run_environment: Environment | None = None  # the merged facts of all artifacts (pitstop analyze)
    missing_ranks: list[int] | None = None  # ranks of the job that did not report (multi-node gather)
    missing_hosts: list[str] | None = None
    single_rank_tokens_per_s: float | None = None  # a one-rank reference for scaling efficiency
    single_rank_source: str | None = None  # where that reference came from
    baseline: HistoryRun | None = None  # the previous run of the same workload in the history (history layer)
    failure: JobFailure | None = None  # how the job failed (pitstop's or the user's stop is none)

    @property
    def environment(self) -> Environment:
        """The environment of the lowest rank (ranks of one job share their configuration)."""
        if self.run_environment is not None:
            return self.run_environment
        return self.ranks[0].environment if self.ranks else Environment()

    @property
    def world_size(self) -> int:
        env_ws = self.environment.world_size
        return max(len(self.ranks), env_ws or 0, 1)

    @property
    def gpus_held(self) -> int:
        """The GPUs the job's processes hold: per process those its model lies on (several under a device
        map), one where that was not recorded; ranks that did not report hold what the lowest one does."""
        held = [r.gpus_held for r in self.ranks]
        missing = max(self.world_size - len(held), 0)
        return sum(held) + missing * (held[0] if held else 1)

    def to_dict(self) -> dict[str, Any]:
        written = to_jsonable(self)
        for rank, saved in zip(self.ranks, written["ranks"], strict=True):
            if rank.trace is not None and isinstance(saved.get("trace"), dict):
                saved["trace"].update(_trace_keys_kept(rank))
        return {"schema": schemas.PROFILE, **written}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunProfile:
        payload = {k: v for k, v in data.items() if k != "schema"}
        if isinstance(payload.get("ranks"), list):
            payload["ranks"] = [_trace_syncs_to_steps(r) for r in payload["ranks"]]
        return from_jsonable(cls, payload)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: Path) -> RunProfile:
        return cls.from_dict(json.loads(path.read_text()))


def _trace_keys_kept(rank: RankProfile) -> dict[str, Any]:
    """The keys a rank's ``trace`` carried before its step time, data wait and syncs became its steps', written
    from the steps (and the environment's GPU name): a document only ever gains keys. Reading ignores them:
    the steps are the source."""
    steps = rank.steps
    syncs = [s.syncs for s in steps if s.syncs is not None]
    blocked = [s.sync_s for s in steps if s.sync_s is not None]
    trace = rank.trace
    return {
        "steps": len(steps),
        "step_ms": None if rank.mean_step_s is None else rank.mean_step_s * 1000,
        "dataloader_ms": None
        if trace is None or trace.breakdown_ms is None
        else trace.breakdown_ms.dataloader,
        "syncs_per_step": sum(syncs) / len(syncs) if syncs else None,
        "sync_ms": sum(blocked) / len(blocked) * 1000 if blocked else None,
        "device_name": rank.environment.gpu_name,
        "attention_ms": None,
    }


def _trace_syncs_to_steps(rank: Any) -> Any:
    """A rank saved before a trace's host syncs were its steps' (``trace.syncs_per_step`` and ``sync_ms``,
    means per step): the same figures spread over its steps, so it reads back with the syncs per step and
    the time blocked it was saved with. Anything else is returned as it came."""
    trace = rank.get("trace") if isinstance(rank, dict) else None
    steps = rank.get("steps") if isinstance(rank, dict) else None
    if not isinstance(trace, dict) or not isinstance(steps, list) or not steps:
        return rank
    per_step, sync_ms = trace.get("syncs_per_step"), trace.get("sync_ms")
    if not isinstance(per_step, int | float) or not all(isinstance(s, dict) for s in steps):
        return rank
    if any(s.get("syncs") is not None for s in steps):
        return rank
    n = len(steps)
    total = round(per_step * n)  # a whole number of syncs over the steps (a mean of counts)
    blocked_s = sync_ms / 1000.0 if isinstance(sync_ms, int | float) else None
    spread = [
        {**s, "syncs": total * (i + 1) // n - total * i // n, "sync_s": blocked_s}
        for i, s in enumerate(steps)
    ]
    return {**rank, "steps": spread}


E = TypeVar("E", bound=StrEnum)


def word(enum: type[E], value: str) -> E:
    """``value`` as the member of ``enum`` it names. A word this pitstop does not know (a newer one wrote it)
    stays the string it was: it still compares and prints as written, and no reader refuses the document."""
    member = enum._value2member_map_.get(value)
    return member if member is not None else value  # type: ignore[return-value]


@functools.cache
def json_keys(cls: type) -> tuple[tuple[str, str], ...]:
    """(field name, JSON key) of each field of a dataclass, in order; the key is the name unless the field's
    metadata names another (``json_key``)."""
    return tuple((f.name, f.metadata.get("json", f.name)) for f in dataclasses.fields(cls))


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {key: to_jsonable(getattr(obj, name)) for name, key in json_keys(type(obj))}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    return obj


@functools.cache
def _fields_of(cls: type) -> tuple[dict[str, Any], dict[str, str]]:
    """Type hints of a dataclass and its field names by JSON key, once per class (a 100k-step profile asks
    100k times)."""
    import typing

    return typing.get_type_hints(cls), {key: name for name, key in json_keys(cls)}


def from_jsonable(cls: type[T], data: Any) -> T:
    """Rebuild a dataclass tree; unknown keys are ignored so older readers accept newer files."""
    hints, names = _fields_of(cls)  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        name = names.get(key)
        if name is None:
            continue
        kwargs[name] = _convert(hints[name], value)
    return cls(**kwargs)


def _convert(hint: Any, value: Any) -> Any:
    import types
    import typing

    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            if arg is type(None):
                continue
            if value == {} and dataclasses.is_dataclass(arg):
                return None  # a record that may be absent, written as an empty object (a trace's old dicts)
            return _convert(arg, value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, dict):
        return from_jsonable(hint, value)
    if isinstance(value, str) and isinstance(hint, type) and issubclass(hint, StrEnum):
        return word(hint, value)
    if origin is list:
        (item,) = typing.get_args(hint)
        return [_convert(item, v) for v in value]
    return value


# -- assembling a RankProfile: the one way every source fills a rank's common fields ------------------------


def window_steps(records: list[StepRecord], warmup: int) -> tuple[list[StepRecord], int]:
    """The measured steps and the warm-up they follow; a run that ended inside the warm-up keeps the steps
    after its first (the first carries start-up costs)."""
    steps = [r for r in records if r.index > warmup]
    if not steps and len(records) > 1:
        return records[1:], 1
    return steps, warmup


def assemble_rank(
    rank: int,
    environment: Environment | None = None,
    *,
    steps: list[StepRecord] | None = None,
    warmup: int | None = None,
    local_rank: int = 0,
    pid: int | None = None,
    gpu_samples: list[GpuSample] | None = None,
    host_samples: list[HostSample] | None = None,
    window: tuple[float | None, float | None] = (None, None),
    errors: list[str] | None = None,
) -> RankProfile:
    """A rank's profile from what its source measured, the common fields filled one way for every source
    (the probe, a rank file a dead process left, a trace, stack samples, GPU logs); what only one source
    knows (a trace's statistics, a collector's counters, how steps were delimited) is set on the result.

    ``steps`` with ``warmup``: every step seen, the warm-up cut off here (``window_steps``); without a
    ``warmup``: the steps as measured, none of them warm-up. ``window``: its start and end, on the source's
    clock. The hostname is the environment's."""
    env = environment if environment is not None else Environment()
    measured, warmup_steps = window_steps(steps or [], warmup) if warmup is not None else (steps or [], 0)
    return RankProfile(
        rank=rank,
        local_rank=local_rank,
        pid=pid,
        hostname=env.hostname,
        warmup_steps=warmup_steps,
        steps=list(measured),
        gpu_samples=list(gpu_samples or []),
        host_samples=list(host_samples or []),
        window_start_t=window[0],
        window_end_t=window[1],
        environment=env,
        probe_errors=list(errors or []),
    )
