"""The published benchmark rows (``../shared/data/published/rows.jsonl``) as ``pitstop plan`` requests.

Each row is one run a team published with its full configuration (llm-foundry, LitGPT, PEFT, Liger,
fms-fsdp; ``SOURCES.md``). ``row_request`` says that configuration in pitstop's words, or returns None
where pitstop cannot express it (``unexpressible`` says why); ``published_peak_bytes`` reads the peak memory
in the unit the source used. Tests of the memory model and of the expected tokens/s both read the rows
through here, so a mapping decision is made once.

Stable API: ``load_rows``, ``row_request``, ``unexpressible``, ``published_peak_bytes``, ``peak_is_allocated``,
``ROWS_PATH``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pitstop.plan.build import PlanRequest
from tests.conftest import ROOT, SHARED, require_shared

ROWS_PATH = SHARED / "published" / "rows.jsonl"
FIXTURES = ROOT / "tests" / "fixtures" / "plan"

Row = dict[str, Any]

# the row's model -> a preset (or a hand-written config under tests/fixtures/plan)
_MODELS: tuple[tuple[str, str], ...] = (
    (r"^MPT-(125m|350m|760m|1b|3b|7b|13b|30b|70b)$", "mpt-{0}"),
    (r"^Llama 2 (7|13|70)[bB]", "llama-2-{0}b"),
    (r"^Llama 2 34[bB]", str(FIXTURES / "llama-2-34b.json")),
    (r"^Llama 3 8B$", "llama-3.1-8b"),  # Llama 3 8B: Llama 3.1 8B's shape (only RoPE scaling differs)
    (r"^phi-1\.5", "phi-1.5"),
    (r"^StableLM Alpha 3B$", "stablelm-base-alpha-3b"),
    (r"^Falcon 40B$", "falcon-40b"),
    (r"^Falcon 7B$", "falcon-7b"),
    (r"bloomz-7b1$", "bloomz-7b1"),
)


def load_rows() -> list[Row]:
    """Every published row (skips the test where the shared data is absent, fails in CI)."""
    path = require_shared("published/rows.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _model(row: Row) -> str | None:
    for pattern, target in _MODELS:
        match = re.search(pattern, str(row["model"]))
        if match:
            return target.format(*(g.lower() for g in match.groups()))
    return None


def unexpressible(row: Row) -> str | None:
    """Why pitstop cannot plan this row (None when it can)."""
    model, hf = str(row["model"]), str(row.get("hf_config") or "")
    method, precision = str(row["method"]), str(row["precision"])
    if "encoder-decoder" in hf:
        return "encoder-decoder model (pitstop plans decoder-only models)"
    if row.get("seq_len") is None or row.get("micro_batch_per_gpu") is None:
        return "sequence length / micro-batch not published"
    if "fp8" in precision:
        return "fp8 compute (TransformerEngine): pitstop's memory and peaks are bf16/fp16"
    if method.startswith("adapter"):
        return "LLaMA-Adapter (v1/v2) is not a pitstop method"
    if "Liger" in str(row.get("other") or ""):
        return "Liger's fused RMSNorm / RoPE / SwiGLU kernels save less than the layer pitstop models"
    if _model(row) is None:
        return f"no preset or config for {model}"
    return None


def _precision(row: Row) -> str:
    """``bf16`` where no fp32 copy of the weights is kept (LitGPT bf16-true; a Trainer on a model loaded in
    bf16, whose AdamW states follow the parameters' dtype). Composer's FSDP ``PURE`` is not that: it
    sets the compute / reduce / buffer dtypes, the sharded parameters and optimizer states stay fp32."""
    text = str(row["precision"])
    if text.startswith("bf16-true") or "model loaded in bf16" in text:
        return "bf16"
    return "mixed"


def _sharding(row: Row) -> tuple[str | None, int, str]:
    """(FSDP strategy, ZeRO stage, offload) from the row's words."""
    text = str(row["sharding"])
    offload = "param" if "CPU offload" in str(row.get("other") or "") else "none"
    if text.startswith("none"):
        return None, 0, "none"
    if "ZeRO-3" in text:
        return None, 3, offload
    if "HSDP" in text:
        return "hybrid_shard", 0, "none"
    if "SHARD_GRAD_OP" in text:
        return "shard_grad_op", 0, "none"
    return "full_shard", 0, "none"  # FULL_SHARD, FSDP1 full_shard, fms-fsdp's "FSDP"


def _optimizer(row: Row) -> str:
    """Composer's ``decoupled_adamw`` steps parameter by parameter (no tensor-list temporaries): the
    fused AdamW's memory; ``torch.optim.AdamW`` is the foreach step."""
    text = str(row["optimizer"])
    if "decoupled_adamw" in text:
        return "adamw_fused"
    if "PagedAdamW8bit" in text or "paged_adamw_8bit" in text:
        return "paged_adamw8bit"
    if "PagedAdamW" in text:  # LitGPT's QLoRA: bnb.optim.PagedAdamW, 32-bit states in paged memory
        return "paged_adamw"
    return "adamw"


def _attn(row: Row) -> str:
    """``flash`` where no mask tensor is materialized (llm-foundry's flash / triton kernels, LitGPT's SDPA
    with ``is_causal``); ``sdpa`` for Hugging Face's SDPA path."""
    text = str(row.get("attention_impl") or "")
    if "flash" in text.lower() or "lit-gpt" in text:
        return "flash"
    return "sdpa"


def _chunked_loss(row: Row) -> bool:
    """llm-foundry's MPT trains with ``loss_fn: fused_crossentropy`` (flash-attn's cross-entropy: bf16
    logits, its gradient written into them in place); lit-gpt's finetune scripts run ``lm_head`` in chunks
    of 128 tokens and ``chunked_cross_entropy`` over them: both the memory of a fused / chunked loss."""
    return str(row["source_id"]) in ("llm-foundry", "litgpt-resource-tables")


def _frozen_reshard(row: Row) -> bool:
    """lit-gpt's multi-GPU LoRA (2023-10, FSDP1 wrapping each Block) held the whole frozen base gathered
    through backward (FSDP1's frozen-parameter reshard, pytorch#95805): its published peaks are the sharded
    base plus all of it (Llama 2 13B on 4 GPUs: 26 + 6.5 GB + activations = 35.6 GB)."""
    return not (str(row["source_id"]) == "litgpt-resource-tables" and "FSDP" in str(row["sharding"]))


def row_request(row: Row) -> PlanRequest | None:
    """The row's configuration as a ``PlanRequest``; None where ``unexpressible`` has a reason."""
    if unexpressible(row) is not None:
        return None
    model = _model(row)
    assert model is not None
    sharding, zero, offload = _sharding(row)
    method = str(row["method"])
    method = "qlora" if method == "qlora" else "lora" if method == "lora" else "full"
    ac = "full" if str(row["activation_checkpointing"]).startswith("full") else "none"
    return PlanRequest(
        model=model,
        gpu=str(row["gpu_pitstop_key"]),
        gpus=int(row["num_gpus"]),
        nodes=int(row.get("num_nodes") or 1),
        seq=int(row["seq_len"]),
        micro_batch=str(int(row["micro_batch_per_gpu"])),
        zero=zero,
        sharding=sharding,
        offload=offload,
        method=method,
        rank=int(row.get("lora_rank") or 16),
        optimizer=_optimizer(row),
        attn=_attn(row),
        checkpointing=ac == "full",
        ac=ac,
        chunked_loss=_chunked_loss(row),
        frozen_reshard=_frozen_reshard(row),
        double_quant="bnb.nf4;" not in str(row.get("other") or ""),  # lit-gpt names nf4 / nf4-dq
        precision=_precision(row),
        compile=bool(row.get("compile")),
        simulate=False,
    )


def published_peak_bytes(row: Row) -> float | None:
    """The published peak memory per GPU in bytes (None where the row has none): LitGPT divides
    ``max_memory_allocated`` by 1e9; Liger's callback reports binary MB (MiB); PEFT's examples' GB are
    taken as GiB (their TorchTracemalloc divides by 2**20 twice)."""
    value = row.get("peak_memory_per_gpu")
    if value is None:
        return None
    unit = str(row.get("peak_memory_unit") or "")
    metric = str(row.get("peak_memory_metric") or "")
    if unit.startswith("MB"):
        return float(value) * 2**20
    if "/ 1e9" in metric:
        return float(value) * 1e9
    return float(value) * 2**30


def peak_is_allocated(row: Row) -> bool:
    """Whether the published peak is ``torch.cuda.max_memory_allocated`` (LitGPT, Liger, PEFT's
    TorchTracemalloc): tensors only, to be compared with ``Memory.allocated`` rather than the total with its
    margin (context, NCCL, fragmentation), which is what decides whether a run fits."""
    metric = str(row.get("peak_memory_metric") or "")
    return "max_memory_allocated" in metric or "peak allocated" in metric


def source_of(row: Row) -> str:
    """The row's source, short (``source_id``)."""
    return str(row["source_id"])


__all__ = [
    "ROWS_PATH",
    "load_rows",
    "peak_is_allocated",
    "published_peak_bytes",
    "row_request",
    "source_of",
    "unexpressible",
]
