"""Representative parameters for every remedy's ``advice``, from the docstring of its params: one case per
branch of the snippet (the values a rule passes from real evidence). A remedy not listed takes ``{}``."""

from __future__ import annotations

from typing import Any

from pitstop.core.vocabulary import RemedyId

Params = dict[str, Any]

PARAMS: dict[RemedyId, list[Params]] = {
    RemedyId.ATTENTION: [
        {"target": "sdpa", "hf_model": True, "alternative": None},
        {"target": "sdpa", "hf_model": False},
        {"mha": True},
    ],
    RemedyId.GROUPED_EXPERTS: [
        {"implementation": "eager", "library": "transformers", "transformers_version": "5.25.0"},
        {"implementation": "loop", "library": None, "site": "MixtralSparseMoeBlock"},
    ],
    RemedyId.PRETOKENIZE: [{"done": "1,319 examples collated once, in 2.1 s"}],
    RemedyId.WORKERS: [{"workers": 3, "basis": "4 cores, 1 process", "pin": False}, {"pin": True}],
    RemedyId.DYNAMIC_COMPILE: [{"dynamic": False, "site": "train.py:40"}, {"dynamic": None}],
    RemedyId.MICRO_BATCH: [
        {"micro": 2, "accum": 8, "new_micro": 8, "new_accum": 2, "basis": "the planner", "planned": 16},
        {},
        {"inference": True, "micro": 2, "new_micro": 8},  # an inference trace: no accumulation
        {"model_small": True, "micro": 2056, "copy_ms": 1.57, "host_ms": 3.1},  # a batch already large
    ],
    RemedyId.BF16: [{}, {"inference": True}],
    RemedyId.SYNC_METRICS_LESS: [
        {"settings": ["include_num_input_tokens_seen=True"], "sites": ["train.py:52"], "logging_steps": 1},
        {"settings": ["self.log(..., sync_dist=True)"], "logging_steps": 10},
    ],
    RemedyId.DEBUG_OFF: [
        {"anomaly": True, "site": "train.py:12", "settings": ["CUDA_LAUNCH_BLOCKING=1"], "profilers": []},
        {
            "anomaly": False,
            "settings": [
                "torch.use_deterministic_algorithms(True)",
                "TrainingArguments(full_determinism=True)",
            ],
            "profilers": ["torch.profiler"],
        },
    ],
    RemedyId.NO_CHECKPOINTING: [{"basis": "the planner: 31 GiB of 80 without checkpointing"}],
    RemedyId.NO_UNUSED_SEARCH: [
        {"site": "train.py:30", "set_by": "the Trainer's default", "parameters": 290}
    ],
    RemedyId.NON_REENTRANT_CHECKPOINTING: [{"site": "model.py:88"}, {"needless": True}],
    RemedyId.SAVE_LESS_OFTEN: [{"save_steps": 10, "every": 10}, {}],
    RemedyId.NO_PER_STEP_CLEANUP: [
        {
            "calls": [
                {"call": "torch.cuda.empty_cache", "site": "train.py:60", "via": None, "setting": None}
            ],
            "gc_enabled": True,
        },
        {"calls": [{"call": "gc.collect", "site": "train.py:61"}], "gc_enabled": False},
    ],
    RemedyId.CPU_THREADS: [{"threads": 3, "ranks": 1, "basis": "4 cores / 1 process, less one"}, {}],
    RemedyId.FUSED_OPTIMIZER: [{"optimizer": "AdamW"}],
    RemedyId.LIGER_KERNELS: [{"installed": False, "model_type": "llama"}],
    RemedyId.EXPANDABLE_SEGMENTS: [{"near_full": False}, {"near_full": True}],
    RemedyId.BALANCE_RANKS: [{"slow_rank": 3, "reason": "longer sequences"}],
    RemedyId.BF16_LORA: [
        {
            "bf16_fits": True,
            "bf16_gib": 30.1,
            "gpu_gib": 80,
            "micro_batch": 2,
            "bits": 4,
            "compute_dtype": "float32",
        },
        {"bf16_fits": False, "micro_batch": 2, "micro_batch_fits": 8, "bits": 4, "compute_dtype": "float32"},
    ],
    RemedyId.BIGGER_BUCKETS: [{"bucket_mb": 100, "per_step": 2400, "mb_per_call": 0.4}],
    RemedyId.COMMUNICATE_LESS: [
        {"reason": "pcie_only", "busbw_gbps": 9.5, "link": "PCIe", "gpus": 8, "nodes": 1},
        {"reason": "ib_disabled", "gpus": 16, "nodes": 2},
    ],
    RemedyId.EVAL_LESS_OFTEN: [{"eval_steps": 10, "save_steps": 10}, {}],
    RemedyId.FASTER_GENERATION: [
        {
            "trainer": "GRPOTrainer",
            "use_vllm": False,
            "num_generations": 8,
            "max_completion_length": 256,
            "generation_batch_size": 16,
        }
    ],
    RemedyId.FIX_TRANSPORT: [{"warnings": ["NCCL_IB_DISABLE=1 is set"], "multi_node": True}],
    RemedyId.LIGHTER_SHARDING: [
        {"current": "full_shard", "target": "shard_grad_op", "gpus_per_node": 8, "saved_s": 0.2},
        {"current": "full_shard", "target": "hybrid_shard", "gpus_per_node": 8},
        {"current": "zero3", "target": "zero2", "deepspeed": True, "gpus_per_node": 8},
        {"current": "zero3", "target": "zero3_hpz", "deepspeed": True, "gpus_per_node": 8},
    ],
    RemedyId.MANUAL_GC: [{"enabled": True, "young_only": False, "frozen": False}],
    RemedyId.MATCH_GPUS: [
        {
            "slow_model": "NVIDIA A10G",
            "slow_ranks": "ranks 6-7",
            "fast_model": "NVIDIA A100-SXM4-80GB",
            "fast_ranks": 6,
            "world_size": 8,
            "fast_devices": "0,1,2,3,4,5",
            "fast_only_ratio": 1.2,
        },
        {},
    ],
    RemedyId.NO_OFFLOAD: [
        {"offloaded": {"optimizer": "cpu", "param": "cpu"}, "fits_without": True, "gpus": 8},
        {"offloaded": {"optimizer": "cpu"}, "fits_without": False, "gpus": 8},
    ],
    RemedyId.NO_SYNC_ACCUMULATION: [{"micro_batches": 8}],
    RemedyId.OVERLAP_COMM: [{}, {"zero_stage": 2}],
    RemedyId.PIN_VERSIONS: [
        {
            "changed": [{"package": "torch", "old": "2.5.1", "new": "2.6.0"}],
            "phase": "backward",
            "baseline_run": 3,
        },
        {"changed": [{"package": "transformers", "old": "4.57.0", "new": "5.0.0"}], "phase": "forward"},
    ],
    RemedyId.PLAIN_DDP: [
        {"current": "full_shard", "ddp_gib": 40.2, "saved_ms": 120},
        {"current": "zero3", "deepspeed": True},
        {"current": "full_shard", "fsdp2": True},
    ],
    RemedyId.UNTHROTTLE_GPU: [{"reasons": ["sw_power_cap"], "rank": 0, "many": False}],
    RemedyId.USE_EVERY_GPU: [{"idle": [1, 2, 3]}],
}


def cases(remedy_id: RemedyId) -> list[Params]:
    """The params a test builds the remedy's advice with."""
    return PARAMS.get(remedy_id, [{}])
