"""The cause catalogue: what each cause id (``pitstop.vocabulary.CauseId``) means, in words a report shows."""

from __future__ import annotations

from dataclasses import dataclass

from pitstop.vocabulary import CauseId


@dataclass(frozen=True)
class Cause:
    id: CauseId
    title: str
    because: str
    needs_gpu: bool


CAUSES: dict[CauseId, Cause] = {
    c.id: c
    for c in (
        Cause(
            CauseId.DATALOADER_BOUND,
            "Input pipeline stalls the step",
            "the accelerator waits on the CPU input pipeline (tokenizing on the fly, too few workers, no prefetch)",
            needs_gpu=False,
        ),
        Cause(
            CauseId.SMALL_BATCH,
            "Batch too small to fill the GPU",
            "the batch is too small to fill the GPU; per-step overhead dominates",
            needs_gpu=True,
        ),
        Cause(
            CauseId.PADDING_WASTE,
            "Compute spent on padding",
            "variable-length examples are padded; compute is spent on pad tokens",
            needs_gpu=False,
        ),
        Cause(
            CauseId.SLOW_ATTENTION,
            "Eager (unfused) attention",
            "attention runs the eager (unfused) path instead of FlashAttention / SDPA",
            needs_gpu=False,
        ),
        Cause(
            CauseId.OFFLOAD_BOUND,
            "Offload makes each step wait on PCIe",
            "optimizer or parameter offload to CPU/NVMe makes each step wait on PCIe",
            needs_gpu=True,
        ),
        Cause(
            CauseId.NO_MIXED_PRECISION,
            "Full fp32 matrix math",
            "matrix math runs in full fp32 without bf16/fp16 or TF32 on a GPU that has tensor cores",
            needs_gpu=True,
        ),
        Cause(
            CauseId.HOST_SYNC,
            "Host blocks on the GPU every step",
            "the host blocks on the GPU every step (.item(), prints, sync copies), so the queue drains",
            needs_gpu=True,
        ),
        Cause(
            CauseId.PAGEABLE_COPIES,
            "Host-to-device copies from pageable memory",
            "host-to-device copies come from pageable memory (pin_memory=False)",
            needs_gpu=True,
        ),
        Cause(
            CauseId.COMMUNICATION_BOUND,
            "Communication not hidden behind compute",
            "multi-GPU: gradient all-reduce / ZeRO gathers are not hidden behind compute",
            needs_gpu=True,
        ),
        Cause(
            CauseId.STRAGGLER,
            "One rank holds the others back",
            "multi-GPU: one rank is slower and everyone waits for it",
            needs_gpu=False,
        ),
        Cause(
            CauseId.EVAL_OVERHEAD,
            "Evaluation and checkpoints eat the run",
            "evaluation or checkpointing runs so often that it takes a large share of the run's time",
            needs_gpu=False,
        ),
        Cause(
            CauseId.IDLE_GPU,
            "A GPU of the job does nothing",
            "multi-GPU: one of the job's GPUs never does any work (a launcher or device-placement mistake)",
            needs_gpu=True,
        ),
        Cause(
            CauseId.NEEDLESS_RECOMPUTE,
            "Activations recomputed that would fit",
            "activation checkpointing re-runs the forward pass inside the backward while the activations would fit "
            "in memory without it",
            needs_gpu=False,
        ),
        Cause(
            CauseId.CHECKPOINT_STALL,
            "Checkpoint saves stall training",
            "checkpoints are saved synchronously so often that the training loop spends a large share of its time "
            "waiting for them",
            needs_gpu=False,
        ),
        Cause(
            CauseId.CPU_OVERSUBSCRIBED,
            "More busy threads than cores",
            "torch's thread pools, DataLoader workers and ranks together run more threads than the cores the job "
            "may use, so threads wait for a core",
            needs_gpu=False,
        ),
        Cause(
            CauseId.UNFUSED_KERNELS,
            "Unfused loss, optimizer or norms",
            "the loss materialises full large-vocabulary logits, the optimizer steps parameter by parameter, or "
            "norms and activations run as separate kernels where fused ones are available",
            needs_gpu=True,
        ),
        Cause(
            CauseId.ALLOCATOR_THRASH,
            "The CUDA allocator thrashes",
            "the caching allocator retries allocations, calls cudaMalloc / cudaFree step after step, or holds "
            "memory fragmented near the limit",
            needs_gpu=True,
        ),
        Cause(
            CauseId.GPU_THROTTLED,
            "A GPU runs below its clock",
            "a busy GPU is held below its application clock by a power cap or thermal / hardware slowdown "
            "(and in a multi-GPU job the others wait for it)",
            needs_gpu=True,
        ),
        Cause(
            CauseId.OVERSHARDED,
            "Sharded more than memory needs",
            "multi-GPU: ZeRO-3 / FSDP FULL_SHARD gathers the weights twice per step although a lighter strategy "
            "(ZeRO-2, SHARD_GRAD_OP) fits, or spans nodes without HYBRID_SHARD / ZeRO++ hpZ, so every gather "
            "crosses the slower network",
            needs_gpu=True,
        ),
        Cause(
            CauseId.GC_PAUSES,
            "Garbage-collector pauses stall the loop",
            "Python's cyclic garbage collector stops the training loop to traverse every tracked object the job "
            "keeps alive (datasets held as Python lists, big dicts), and its full collections land inside steps",
            needs_gpu=False,
        ),
        Cause(
            CauseId.LOW_MFU_UNEXPLAINED,
            "Busy GPU, low FLOPs utilization",
            "utilization is high but model-FLOPs utilization stays far below what the GPU can do",
            needs_gpu=True,
        ),
    )
}


def cause(cause_id: CauseId) -> Cause:
    """What the cause means; every CauseId has its entry (a test holds the two to each other)."""
    return CAUSES[cause_id]
