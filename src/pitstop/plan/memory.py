"""Memory per GPU, by component, for one training configuration.

Model states follow DeepSpeed's own accounting (``estimate_zero2_model_states_mem_needs`` /
``estimate_zero3_model_states_mem_needs``) for bf16 mixed precision with AdamW: bf16 weights and gradients,
and per parameter 16 bytes of fp32 master weight, fp32 gradient and two Adam moments in the partition the
optimizer owns. Without ZeRO, the usual 16 bytes per parameter (2 + 2 + 12). ZeRO-3 also holds the largest
single module gathered (4 bytes per parameter, DeepSpeed's figure). Frozen weights (LoRA) need no gradient
or optimizer state; QLoRA stores them in 4 bits (0.5 byte + ~3% quantization constants). An FSDP strategy
has its ZeRO stage's memory (SHARD_GRAD_OP as ZeRO-2, FULL_SHARD as ZeRO-3); HYBRID_SHARD shards over one
node's GPUs only, and ZeRO++ hpZ adds its node-local secondary copy of the weights (2 bytes / hpz).

Precision (``--precision``): ``mixed`` is the above; ``bf16`` keeps no fp32 copy at all (torchtune's
default, LitGPT's ``bf16-true``, a Trainer on a model loaded in bf16): weights, gradients and the optimizer's
moments in bf16, 2 + 2 + 4 = 8 bytes per parameter with AdamW (8-bit moments stay 2 bytes). The optimizer's
moments by kind (``MOMENTS``): AdamW two, SGD one, Adafactor factored (~2 bytes), 8-bit AdamW two 8-bit
ones. A *paged* optimizer (bitsandbytes ``PagedAdamW`` / ``PagedAdamW8bit``) keeps its moments in CUDA unified
memory, which the driver pages to the host under pressure and the caching allocator does not count: they are
counted on the host (``cpu``), not against the GPU. ``--optimizer-in-backward`` steps each parameter as its
gradient is ready, so no full gradient buffer is held: only the largest module's gradient at a time.
``torch.optim.AdamW``'s default foreach step (``adamw``) builds a tensor list the size of the second moment
(``_foreach_sqrt``) for the whole parameter group; the fused step (``adamw_fused``, and per-parameter loops
such as Composer's ``DecoupledAdamW``) does not. The step runs after backward has freed the activations, so
it only raises the peak by what that temporary exceeds them (``Memory.optimizer_step``).

Activations are bytes per token per layer, derived from what a Hugging Face decoder layer saves for
backward in bf16 (and checked against a fake-tensor simulation of a real step, ``plan.simulate``):

* two RMSNorms save their fp32 input and bf16 normalized output (2 × 6h), and the linears after them the
  scaled output (2 × 2h);
* attention saves q and its output for the fused kernel plus the output projection's input (~6h; 24h in all
  with the norms and residual stream) and k, v (4 · kv_heads · head_dim);
* the gated MLP saves gate, up, their activation and product (8 · intermediate); a non-gated one (GPT-2,
  MPT, Falcon, BLOOM, Phi, GPT-NeoX: fc1 -> GELU -> fc2) saves the GELU's input and fc2's input
  (4 · intermediate), half of it;
* a LayerNorm family saves less than Hugging Face's RMSNorm (which upcasts to fp32 in any precision): its
  fp32 input under autocast (4h instead of 6h per norm), its bf16 input in a pure-bf16 model or with MPT's
  low_precision_layernorm (2h);
* the causal mask handed to attention adds 2 · seq bytes per token;
* eager attention also keeps the softmax probabilities in fp32 and bf16: 6 · heads · seq bytes per token;
* with activation checkpointing (``--ac full``) a layer keeps only its input (2h), and one layer is
  recomputed at a time; torchtitan's selective (op-level) policy (``--ac selective``) keeps the layer's input,
  the attention output and every second matmul's output (its ``mm`` counter saves the odd ones, recomputes
  the even ones) and recomputes the rest; its per-N-layers form (``--ac-every N``) checkpoints every N-th
  layer fully and keeps the others whole;
* with activation offloading (``--ac-offload``) what the layers save goes to pinned host memory as the
  forward runs: the GPU holds the layer in flight and the one being copied (two layers), the host the rest.

Plus 8h per token outside the layers (embedding output, final norm), and the logits: Transformers' loss
(``ForCausalLMLoss``) upcasts them to fp32 and ``cross_entropy``'s log-softmax keeps its fp32 output for
backward (4 · vocab bytes per token); at the start of backward the NLL's gradient (fp32) and the
log-softmax's input gradient (fp32) are made while that output is still held: 12 · vocab bytes per token at
the peak (the bf16 logits themselves are freed once the loss is formed); a chunked / fused cross-entropy
avoids most of it (2 · vocab). Under QLoRA bitsandbytes quantizes the decoder's linears only: the input
embedding and ``lm_head`` stay in bf16 (2 bytes per parameter), the rest is 4-bit.

The margin is what the run adds beyond tensors: the CUDA context and library workspaces (1 GiB), the caching
allocator's fragmentation (8% of the rest), NCCL's communication buffers once there is more than one GPU
(each channel keeps send / receive buffers for its ring and tree peers, ~18 MiB per channel at the default
4 MiB NCCL_BUFFSIZE, 16-32 channels on NVLink: 384 MiB; a collective's ring / tree has a fixed number of
peers per rank, so the buffers do not grow with the job's GPU count), and with CUDA graphs
(``torch.compile(mode="reduce-overhead")``) the graph's private pool, which eager allocations cannot reuse
(taken as a quarter of the activations plus the static copies of the inputs).
"""

from __future__ import annotations

from dataclasses import dataclass

from pitstop.core.profile import ModelInfo

GIB = 2**30
MIB = 2**20
CONTEXT_BYTES = 1.0 * GIB  # CUDA context, cuBLAS / cuDNN workspaces
FRAGMENTATION = 0.08  # share of the rest the caching allocator typically cannot reuse
NCCL_BASE_BYTES = 384 * MIB  # communication buffers once a process group spans GPUs (module doc)
CUDA_GRAPH_POOL_SHARE = 0.25  # of the activations, held by a captured graph's private memory pool

OPTIMIZERS = {  # bytes per trainable parameter the optimizer keeps under mixed precision (fp32 master included)
    "adamw": 12,
    "adamw_fused": 12,  # the same states; no foreach temporaries in its step
    "adamw8bit": 6,  # fp32 master + two 8-bit moments
    "paged_adamw": 12,  # bitsandbytes PagedAdamW: fp32 moments in paged (unified) memory
    "paged_adamw8bit": 6,  # bitsandbytes PagedAdamW8bit: 8-bit moments in paged memory
    "sgd": 8,  # fp32 master + momentum
    "adafactor": 6,  # fp32 master + factored second moment (about 2 bytes / param on large matrices)
}
MASTER_BYTES = 4  # the fp32 master weight inside OPTIMIZERS' figures
EIGHT_BIT = {"adamw8bit", "paged_adamw8bit"}  # moments quantized to 8 bits whatever the precision
PAGED = {"paged_adamw", "paged_adamw8bit"}  # moments in unified memory, paged to the host under pressure
FOREACH_TEMP = {"adamw": 1.0}  # tensor lists the step builds, in units of one moment (torch's _foreach_sqrt)
PRECISIONS = ("mixed", "bf16")
AC_MODES = ("none", "full", "selective")
# families whose q, k, v come out of one fused matmul (the order torchtitan's matmul counter sees)
FUSED_QKV = {"mpt", "falcon", "bloom", "gpt2", "gpt_bigcode", "gpt_neox", "codegen", "gptj_fused"}


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
    precision: str = "mixed"  # mixed: fp32 master + moments; bf16: pure bf16 weights, gradients, moments
    ac: str = "none"  # none, full, selective (``checkpointing`` True means full)
    ac_every: int = 0  # selective per-N-layers: every N-th layer checkpointed; 0: the op-level policy
    ac_offload: bool = False  # activations offloaded to the host as the forward runs
    optimizer_in_backward: bool = False  # each parameter stepped in backward: no gradient buffer
    norm: str | None = None  # rms, layer, low_precision (model_shape.norm_kind); None: from the model type
    # FSDP1 before PyTorch's frozen-parameter reshard (pytorch#95805, fixed by #101982): a LoRA base's frozen
    # units gathered in backward stay gathered to its end, so the whole frozen base is held at the peak
    frozen_reshard: bool = True
    double_quant: bool = True  # QLoRA's nf4 block constants quantized again (bnb_4bit_use_double_quant)

    @property
    def ac_mode(self) -> str:
        """The checkpointing in force: ``full`` where ``checkpointing`` says so, else ``ac``."""
        return "full" if self.checkpointing else self.ac

    @property
    def pure_bf16(self) -> bool:
        return self.precision == "bf16"

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
    optimizer_step: float = 0.0  # the step's temporaries beyond the activations backward has freed
    graph_pool: float = 0.0  # the part of the margin the caching allocator hands out (CUDA graphs' pool)

    @property
    def allocated(self) -> float:
        """What ``torch.cuda.max_memory_allocated`` counts at the peak: the tensors (and a captured graph's
        pool), not the CUDA context, NCCL's buffers (cudaMalloc'd outside the caching allocator) nor the
        fragmentation (reserved but not allocated). Published peaks are mostly this figure."""
        return self.total - self.margin + self.graph_pool

    @property
    def total(self) -> float:
        return (
            self.weights
            + self.gradients
            + self.optimizer
            + self.activations
            + self.logits
            + self.margin
            + self.optimizer_step
        )

    def gib(self) -> dict[str, float]:
        parts = ("weights", "gradients", "optimizer", "activations", "logits", "margin")
        out = {k: round(getattr(self, k) / GIB, 3) for k in parts}
        if self.optimizer_step:
            out["optimizer_step"] = round(self.optimizer_step / GIB, 3)
        out["total"] = round(self.total / GIB, 3)
        return out


def moments_bytes(s: Setup) -> float:
    """Bytes per trained parameter of the optimizer's moments (no master copy): fp32 under mixed precision,
    the parameters' bf16 under pure bf16, 8-bit ones either way."""
    moments = float(OPTIMIZERS[s.optimizer] - MASTER_BYTES)
    if s.pure_bf16 and s.optimizer not in EIGHT_BIT:
        moments /= 2
    return moments


def _frozen_bytes(s: Setup, frozen: float) -> float:
    """The frozen base of LoRA / QLoRA: bf16, or under QLoRA 4-bit (``nf4_bytes``)
    for the decoder's linears while the input embedding and ``lm_head`` stay bf16 (bitsandbytes quantizes
    ``nn.Linear`` modules and Transformers keeps the output embedding out of it)."""
    if s.method != "qlora":
        return 2.0 * frozen
    m = s.model
    embedding = float(m.params_embedding or 0)
    if not m.tied_embeddings:
        embedding += float((m.vocab_size or 0) * (m.hidden_size or 0))
    embedding = min(embedding, frozen)
    return 2.0 * embedding + nf4_bytes(s.double_quant) * (frozen - embedding)


def nf4_bytes(double_quant: bool) -> float:
    """Bytes per 4-bit parameter: half a byte plus one absmax per 64-parameter block, fp32 (4 / 64) or,
    double-quantized, 8-bit with an fp32 constant per 256 blocks (1 / 64 + 4 / 16384; bitsandbytes)."""
    return 0.5 + (1.0 / 64 + 4.0 / (64 * 256) if double_quant else 4.0 / 64)


def model_states(s: Setup) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer, host) bytes per GPU."""
    p, n = float(s.total_params), s.shard_ranks
    t = float(s.trainable_params)
    frozen = p - t
    moments = moments_bytes(s)
    paged = s.optimizer in PAGED  # the moments live on the host side of unified memory (module doc)
    if s.method in ("lora", "qlora"):
        base = _frozen_bytes(s, frozen)
        # adapters train in fp32 (peft keeps trainable weights in fp32 under autocast): weights 4, grads 4;
        # in a pure-bf16 model they are bf16 like the rest
        width = 2.0 if s.pure_bf16 else 4.0
        weights = (
            base / (n if s.zero >= 3 else 1) + width * t + (4.0 * s.largest_module if s.zero >= 3 else 0.0)
        )
        if s.zero >= 3 and n > 1 and not s.frozen_reshard:
            # every frozen unit's gathered copy, held through backward beside the shard (and covering the
            # module in flight)
            weights += base - 4.0 * s.largest_module
        grads = width * min(t, float(s.largest_module)) if s.optimizer_in_backward else width * t
        opt = moments * t / (n if s.zero >= 1 else 1)  # the adapter weight is its own master
        return (weights, grads, 0.0, opt) if paged else (weights, grads, opt, 0.0)
    if s.pure_bf16:
        return _pure_bf16_states(s, p, n, moments, paged)
    if paged or s.optimizer_in_backward:
        return _mixed_states_split(s, p, n, moments, paged)
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
    return largest + _bf16_shard(s) * p / n, 0.0, optim * p / n, 0.0


def _bf16_shard(s: Setup) -> float:
    """Bytes per parameter of a bf16 copy of the shard beside the fp32 master under mixed precision:
    DeepSpeed ZeRO-3 keeps one (2); FSDP FULL_SHARD / HYBRID_SHARD does not (0): its sharded flat parameter
    is the fp32 master itself, cast to bf16 only as a unit is gathered (``MixedPrecision(param_dtype=bf16)``)."""
    return 0.0 if s.sharding is not None and not s.pure_bf16 else 2.0


def _sharded_weights(s: Setup, p: float, n: int) -> float:
    """bf16 weights per GPU: all of them below ZeRO-3, else the shard plus the module gathered (and hpZ)."""
    if s.zero < 3:
        return 2 * p
    weights = 4.0 * s.largest_module + _bf16_shard(s) * p / n
    if s.hpz > 1:
        weights += 2 * p / s.hpz
    return weights


def _pure_bf16_states(
    s: Setup, p: float, n: int, moments: float, paged: bool
) -> tuple[float, float, float, float]:
    """Full training with no fp32 copy: bf16 weights and gradients, moments in bf16 (or 8-bit), each sharded
    as the ZeRO stage / FSDP strategy shards it; offload moves the moments (and with ``param`` the weights)
    to the host."""
    weights = _sharded_weights(s, p, n)
    grads = 2.0 * s.largest_module if s.optimizer_in_backward else 2 * p / (n if s.zero >= 2 else 1)
    opt = moments * p / (n if s.zero >= 1 else 1)
    host = 0.0
    if s.offload != "none":
        host, opt = opt * n * 1.5, 0.0
        if s.offload == "param":
            host += 2 * p * 1.5
            weights = 4.0 * s.largest_module
    if paged:
        host, opt = host + opt, 0.0
    return weights, grads, opt, host


def _mixed_states_split(
    s: Setup, p: float, n: int, moments: float, paged: bool
) -> tuple[float, float, float, float]:
    """Mixed precision where the moments page to the host or the step runs inside backward: bf16 weights,
    the fp32 master on the GPU, the moments on the GPU or (paged) the host, and the gradients whole, sharded,
    or (in backward) only the largest module's."""
    if s.offload != "none":
        raise ValueError("a paged or in-backward optimizer with DeepSpeed offload")
    weights = _sharded_weights(s, p, n)
    shard = n if s.zero >= 1 else 1
    if s.optimizer_in_backward:
        grads = 2.0 * s.largest_module
    else:  # bf16 gradients, plus the fp32 copy the optimizer steps on once sharded (as DeepSpeed counts)
        grads = (2 * p if s.zero < 3 else 0.0) + (4 * p / shard if s.zero >= 1 else 0.0)
    master = MASTER_BYTES * p / shard
    opt = moments * p / shard
    if paged:
        return weights, grads, master, opt
    return weights, grads, master + opt, 0.0


def optimizer_step_temporaries(s: Setup) -> float:
    """The tensor lists torch's foreach AdamW builds in its step (one moment's size over the trained
    parameters of this GPU's shard); 0 for fused / per-parameter steps and in-backward steps."""
    share = FOREACH_TEMP.get(s.optimizer, 0.0)
    if not share or s.optimizer_in_backward or s.offload != "none":
        return 0.0
    one_moment = moments_bytes(s) / 2
    return share * one_moment * s.trainable_params / (s.shard_ranks if s.zero >= 1 else 1)


def _arch(s: Setup) -> tuple[bool, str]:
    """(gated MLP, norm kind) of the planned model's family (``model_shape``)."""
    from pitstop.plan.model_shape import mlp_gated, norm_kind

    return mlp_gated(s.model.model_type), s.norm or norm_kind(s.model.model_type)


def _norm_bytes(s: Setup, hidden: float) -> float:
    """What one norm itself saves per token (module doc): RMSNorm 6h, LayerNorm 4h under autocast, 2h in bf16."""
    kind = _arch(s)[1]
    if kind == "rms":
        return 6.0 * hidden
    if kind == "layer" and not s.pure_bf16:
        return 4.0 * hidden
    return 2.0 * hidden


def full_layer_bytes(s: Setup) -> float:
    """What one decoder layer saves for backward per token with no checkpointing (bytes; module doc)."""
    m = s.model
    hidden = float(m.hidden_size or 0)
    gated = _arch(s)[0]
    per = 24.0 * hidden - 2 * (6.0 * hidden - _norm_bytes(s, hidden))
    per += 4.0 * (m.n_kv_heads or 0) * (m.head_dim or 0) + (8.0 if gated else 4.0) * (
        m.intermediate_size or 0
    )
    if s.attn == "flash":
        # no mask tensor, and the kernel's (b, s, heads, d) output reshapes into o_proj's input as a view
        per -= 2.0 * hidden
    else:
        per += 2.0 * s.seq
    if s.attn == "eager":
        per += 6.0 * (m.n_heads or 0) * s.seq
    if s.method in ("lora", "qlora"):
        # each adapted linear keeps its rank-r intermediate (7 linears gated, 6 without the gate)
        per += 2.0 * s.lora_rank * (7 if gated else 6)
    return per


def selective_layer_bytes(s: Setup) -> float:
    """What torchtitan's op-level selective checkpointing keeps of one layer per token: its input, the
    attention output, and the outputs of the odd-numbered matmuls in the layer's order (module doc)."""
    m = s.model
    hidden = float(m.hidden_size or 0)
    q = float((m.n_heads or 0) * (m.head_dim or 0)) or hidden
    kv = float((m.n_kv_heads or 0) * (m.head_dim or 0))
    inter = float(m.intermediate_size or 0)
    gated = _arch(s)[0]
    matmuls = [q + 2 * kv, hidden] if (m.model_type or "") in FUSED_QKV else [q, kv, kv, hidden]
    matmuls += [inter, inter, hidden] if gated else [inter, hidden]
    kept = sum(matmuls[0::2])  # the 1st, 3rd, ... matmul's output is saved, the 2nd, 4th, ... recomputed
    per = 2.0 * hidden + 2.0 * q + 2.0 * kept + (0.0 if s.attn == "flash" else 2.0 * s.seq)
    if s.method in ("lora", "qlora"):
        per += 2.0 * s.lora_rank * (7 if gated else 6)
    return per


def activation_bytes_per_token_layer(s: Setup) -> float:
    """What one decoder layer holds for backward, per token (bytes, bf16), averaged over the layers under
    the checkpointing in force."""
    hidden = float(s.model.hidden_size or 0)
    mode = s.ac_mode
    if mode == "full":
        return 2.0 * hidden
    if mode == "selective":
        layers = s.model.n_layers or 0
        if s.ac_every > 0 and layers:
            checkpointed = layers // s.ac_every
            return (checkpointed * 2.0 * hidden + (layers - checkpointed) * full_layer_bytes(s)) / layers
        return selective_layer_bytes(s)
    return full_layer_bytes(s)


def held_activations(s: Setup) -> float:
    """Activations alive on the GPU at the end of the forward pass (with ``ac_offload``: two layers' worth,
    the rest on the host)."""
    layers, hidden = s.model.n_layers or 0, s.model.hidden_size or 0
    in_layers = min(layers, 2) if s.ac_offload else layers
    return s.micro_batch * s.seq * (in_layers * activation_bytes_per_token_layer(s) + 8.0 * hidden)


def offloaded_activations(s: Setup) -> float:
    """Host memory the offloaded activations take (pinned), 0 without ``ac_offload``."""
    if not s.ac_offload:
        return 0.0
    layers = s.model.n_layers or 0
    return s.micro_batch * s.seq * max(layers - 2, 0) * activation_bytes_per_token_layer(s)


def activations(s: Setup) -> float:
    """The activation component of the peak: what the forward pass holds, plus under checkpointing the one
    layer being recomputed during backward."""
    held = held_activations(s)
    if s.ac_mode != "none":
        held += s.micro_batch * s.seq * full_layer_bytes(s)
    return held


def held_after_forward(s: Setup) -> float:
    """What the end of the forward pass holds for backward: activations plus the fp32 logits the loss keeps
    (the quantity the fake-tensor simulation measures)."""
    return held_activations(s) + s.micro_batch * s.seq * 4.0 * (s.model.vocab_size or 0)


def logits(s: Setup) -> float:
    tokens = s.micro_batch * s.seq
    vocab = s.model.vocab_size or 0
    per_token = 12.0 * vocab  # fp32 log-softmax output, its gradient and its input's gradient (module doc)
    if s.chunked_loss:
        per_token = 2.0 * vocab  # fused / chunked cross-entropy: bf16 logits, fp32 only chunk by chunk
    return tokens * per_token


def margin(s: Setup, tensors: float, act: float) -> float:
    """What the run holds beyond its tensors (module doc): context, fragmentation, NCCL, CUDA graphs."""
    extra = CONTEXT_BYTES + FRAGMENTATION * tensors
    if s.gpus > 1:
        extra += NCCL_BASE_BYTES
    return extra + graph_pool(s, act)


def graph_pool(s: Setup, act: float) -> float:
    """A captured CUDA graph's private pool (0 without CUDA graphs): a share of the activations plus the
    static copies of the inputs (input_ids, labels)."""
    if not s.cuda_graphs:
        return 0.0
    return CUDA_GRAPH_POOL_SHARE * act + 8.0 * s.micro_batch * s.seq


def memory(s: Setup, gpu_bytes: float) -> Memory:
    weights, grads, opt, host = model_states(s)
    act = activations(s)
    lg = logits(s)
    step = max(0.0, optimizer_step_temporaries(s) - act - lg)  # the step runs once backward freed these
    margin_ = margin(s, weights + grads + opt + act + lg + step, act)
    return Memory(
        weights=weights,
        gradients=grads,
        optimizer=opt,
        activations=act,
        logits=lg,
        margin=margin_,
        cpu=host + offloaded_activations(s),
        optimizer_step=step,
        graph_pool=graph_pool(s, act),
    )
