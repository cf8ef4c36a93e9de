"""Memory per GPU, by component, for one training configuration.

Model states follow DeepSpeed's own accounting (``estimate_zero2_model_states_mem_needs`` /
``estimate_zero3_model_states_mem_needs``) for bf16 mixed precision with AdamW: bf16 weights and gradients,
and per parameter 16 bytes of fp32 master weight, fp32 gradient and two Adam moments in the partition the
optimizer owns. Without ZeRO, the usual 16 bytes per parameter (2 + 2 + 12). ZeRO-3 also holds the largest
single module gathered (4 bytes per parameter, DeepSpeed's figure). Frozen weights (LoRA) need no gradient
or optimizer state; QLoRA stores them in 4 bits (0.5 byte + ~3% quantization constants). An FSDP strategy
has its ZeRO stage's memory (SHARD_GRAD_OP as ZeRO-2, FULL_SHARD as ZeRO-3); HYBRID_SHARD shards over one
node's GPUs only, and ZeRO++ hpZ adds its node-local secondary copy of the weights (2 bytes / hpz).

Activations are bytes per token per layer, derived from what a Hugging Face decoder layer saves for
backward in bf16 (and checked against a fake-tensor simulation of a real step, ``plan.simulate``):

* two RMSNorms save their fp32 input and bf16 normalized output (2 × 6h), and the linears after them the
  scaled output (2 × 2h);
* attention saves q and its output for the fused kernel plus the output projection's input (~6h; 24h in all
  with the norms and residual stream) and k, v (4 · kv_heads · head_dim);
* the gated MLP saves gate, up, their activation and product (8 · intermediate);
* the causal mask handed to attention adds 2 · seq bytes per token;
* eager attention also keeps the softmax probabilities in fp32 and bf16: 6 · heads · seq bytes per token;
* with activation checkpointing a layer keeps only its input (2h), and one layer is recomputed at a time.

Plus 8h per token outside the layers (embedding output, final norm), and the logits: the loss upcasts them
to fp32 (4 · vocab bytes per token, held for backward) and backward adds an fp32 and a bf16 gradient of the
same shape (10 · vocab bytes per token at its peak); a chunked / fused cross-entropy avoids most of it.

The margin is what the run adds beyond tensors: the CUDA context and library workspaces (1 GiB), the caching
allocator's fragmentation (8% of the rest), NCCL's communication buffers once there is more than one GPU
(each channel keeps send / receive buffers for its peers, ~18 MiB per channel at the default 4 MiB
NCCL_BUFFSIZE, 16-32 channels on NVLink: 384 MiB plus 16 MiB per rank), and with CUDA graphs
(``torch.compile(mode="reduce-overhead")``) the graph's private pool, which eager allocations cannot reuse
(taken as a quarter of the activations plus the static copies of the inputs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pitstop.core.profile import ModelInfo

GIB = 2**30
MIB = 2**20
CONTEXT_BYTES = 1.0 * GIB  # CUDA context, cuBLAS / cuDNN workspaces
FRAGMENTATION = 0.08  # share of the rest the caching allocator typically cannot reuse
NCCL_BASE_BYTES = 384 * MIB  # communication buffers once a process group spans GPUs (module doc)
NCCL_PER_RANK_BYTES = 16 * MIB
CUDA_GRAPH_POOL_SHARE = 0.25  # of the activations, held by a captured graph's private memory pool

OPTIMIZERS = {  # bytes per trainable parameter the optimizer keeps (fp32 master weight included)
    "adamw": 12,
    "adamw8bit": 6,  # fp32 master + two 8-bit moments
    "sgd": 8,  # fp32 master + momentum
    "adafactor": 6,  # fp32 master + factored second moment (about 2 bytes / param on large matrices)
}


@dataclass
class Setup:
    """One training configuration on one kind of GPU: the model, and the run's choices around it.

    ``model`` is the model's shape and parameter counts (``profile.ModelInfo``, the type the probe and ingest
    fill): model states need ``params_total``, activations and logits the dimensions; a dimension it does
    not know is ``None`` and counts as 0 (``plan.from_run.has_shape`` says whether all are known).
    """

    model: ModelInfo
    seq: int
    lora_params: int = 0  # trainable parameters when the method is LoRA / QLoRA (counted for lora_rank)
    largest_module: int = 0  # the largest single module's own parameters (what ZeRO-3 gathers at once)
    micro_batch: int = 1
    gpus: int = 1
    zero: int = 0
    offload: str = "none"  # none, optimizer, param (implies optimizer), as DeepSpeed allows
    method: str = "full"  # full, lora, qlora
    optimizer: str = "adamw"
    attn: str = "sdpa"  # sdpa, flash, eager
    checkpointing: bool = False
    chunked_loss: bool = False
    lora_rank: int = 16
    cuda_graphs: bool = False  # torch.compile(mode="reduce-overhead") / captured steps
    sharding: str | None = None  # an FSDP strategy (vocabulary.Sharding); ``zero`` then holds its ZeRO stage
    nodes: int = 1
    hpz: int = 1  # DeepSpeed ZeRO++ zero_hpz_partition_size: ZeRO-3's secondary copy of the shard

    @property
    def total_params(self) -> int:
        return self.model.params_total or 0

    @property
    def trainable_params(self) -> int:
        return self.total_params if self.method == "full" else self.lora_params

    @property
    def shard_ranks(self) -> int:
        """The GPUs model states are sharded over: a node's for HYBRID_SHARD, else every GPU."""
        if self.sharding in ("hybrid_shard", "hybrid_shard_zero2"):
            return max(self.gpus // max(self.nodes, 1), 1)
        return max(self.gpus, 1)


@dataclass
class Memory:
    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    margin: float
    cpu: float = 0.0  # host memory the offload needs

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.logits + self.margin

    def gib(self) -> dict[str, float]:
        parts = ("weights", "gradients", "optimizer", "activations", "logits", "margin")
        out = {k: round(getattr(self, k) / GIB, 3) for k in parts}
        out["total"] = round(self.total / GIB, 3)
        return out


def model_states(s: Setup) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer, host) bytes per GPU."""
    p, n = float(s.total_params), s.shard_ranks
    t = float(s.trainable_params)
    frozen = p - t
    if s.method in ("lora", "qlora"):
        base = frozen * (0.5 * 1.03 if s.method == "qlora" else 2.0)
        # adapters train in fp32 (peft keeps trainable weights in fp32 under autocast): weights 4, grads 4
        weights = base / (n if s.zero >= 3 else 1) + 4 * t + (4.0 * s.largest_module if s.zero >= 3 else 0.0)
        grads = 4 * t
        opt = (OPTIMIZERS[s.optimizer] - 4) * t  # the fp32 adapter weight is its own master
        return weights, grads, opt / (n if s.zero >= 1 else 1), 0.0
    optim = (
        OPTIMIZERS[s.optimizer] + 4
    )  # + the fp32 gradient the optimizer steps on (DeepSpeed's 16 for AdamW)
    if s.zero == 0:
        return 2 * p, 2 * p, OPTIMIZERS[s.optimizer] * p, 0.0
    if s.zero in (1, 2):
        if s.offload != "none":  # ZeRO-Offload: only the bf16 weights stay on the GPU
            host = p * max(4 * n, 16) * 1.5
            return 2 * p, 0.0, 0.0, host
        return 2 * p, 2 * p, optim * p / n, 0.0
    largest = 4.0 * s.largest_module  # the module gathered for compute
    if s.hpz > 1:  # ZeRO++ hpZ keeps a second, node-local partition of the bf16 weights
        largest += 2 * p / s.hpz
    if s.offload == "param":
        return largest, 0.0, 0.0, p * 18 * 1.5
    if s.offload == "optimizer":
        return largest + 2 * p / n, 0.0, 0.0, p * 16 * 1.5
    return largest + 2 * p / n, 0.0, optim * p / n, 0.0


def activation_bytes_per_token_layer(s: Setup) -> float:
    """What one decoder layer holds for backward, per token (bytes, bf16)."""
    m = s.model
    hidden = m.hidden_size or 0
    if s.checkpointing:
        return 2.0 * hidden
    per = 24.0 * hidden + 4.0 * (m.n_kv_heads or 0) * (m.head_dim or 0) + 8.0 * (m.intermediate_size or 0)
    per += 2.0 * s.seq
    if s.attn == "eager":
        per += 6.0 * (m.n_heads or 0) * s.seq
    if s.method in ("lora", "qlora"):
        per += 2.0 * s.lora_rank * 7  # each adapted linear keeps its rank-r intermediate (7 linears)
    return per


def held_activations(s: Setup) -> float:
    """Activations alive at the end of the forward pass."""
    layers, hidden = s.model.n_layers or 0, s.model.hidden_size or 0
    return s.micro_batch * s.seq * (layers * activation_bytes_per_token_layer(s) + 8.0 * hidden)


def activations(s: Setup) -> float:
    """The activation component of the peak: what the forward pass holds, plus with checkpointing the one layer
    being recomputed during backward."""
    held = held_activations(s)
    if s.checkpointing:
        held += s.micro_batch * s.seq * activation_bytes_per_token_layer(replace(s, checkpointing=False))
    return held


def held_after_forward(s: Setup) -> float:
    """What the end of the forward pass holds for backward: activations plus the fp32 logits the loss keeps
    (the quantity the fake-tensor simulation measures)."""
    return held_activations(s) + s.micro_batch * s.seq * 4.0 * (s.model.vocab_size or 0)


def logits(s: Setup) -> float:
    tokens = s.micro_batch * s.seq
    vocab = s.model.vocab_size or 0
    per_token = 10.0 * vocab
    if s.chunked_loss:
        per_token = 2.0 * vocab  # fused / chunked cross-entropy: bf16 logits, fp32 only chunk by chunk
    return tokens * per_token


def margin(s: Setup, tensors: float, act: float) -> float:
    """What the run holds beyond its tensors (module doc): context, fragmentation, NCCL, CUDA graphs."""
    extra = CONTEXT_BYTES + FRAGMENTATION * tensors
    if s.gpus > 1:
        extra += NCCL_BASE_BYTES + NCCL_PER_RANK_BYTES * s.gpus
    if s.cuda_graphs:
        extra += CUDA_GRAPH_POOL_SHARE * act + 8.0 * s.micro_batch * s.seq  # + static input_ids / labels
    return extra


def memory(s: Setup, gpu_bytes: float) -> Memory:
    weights, grads, opt, host = model_states(s)
    act = activations(s)
    lg = logits(s)
    margin_ = margin(s, weights + grads + opt + act + lg, act)
    return Memory(
        weights=weights, gradients=grads, optimizer=opt, activations=act, logits=lg, margin=margin_, cpu=host
    )
