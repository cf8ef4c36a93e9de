"""A model's shape (``profile.ModelInfo``) and parameter counts from its Hugging Face ``config.json``,
without instantiating it.

Covers the decoder-only families people fine-tune: Llama-style (Llama, Mistral, Mixtral, Qwen2/2.5/3,
Gemma/Gemma 2, Phi-3, SmolLM, ...) and GPT-2-style. Counts follow the modules those models build: gated
MLPs (gate, up, down), grouped-query attention, biases where the config or family has them, RMSNorm /
LayerNorm weights, MoE experts and router, tied or separate output embeddings.

Configs name their dimensions in their family's words (MPT's ``d_model`` / ``n_layers`` / ``n_heads`` /
``expansion_ratio``, BLOOM's and Falcon's ``n_layer`` / ``n_head``, GPT-2's ``n_embd``); ``ATTRIBUTE_MAP``
reads them the way Transformers' ``attribute_map`` does. ``mlp_gated`` and ``norm_kind`` say what the memory
model needs to know of a family's layer: whether its MLP is gated (SwiGLU: gate, up, down) or not (GELU:
fc1, fc2, as GPT-2, MPT, Falcon, BLOOM, Phi, GPT-NeoX), and which norm it runs. Encoder-decoder models (T5,
BART, ...) are refused in one line: the plan's layer is a decoder's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from pitstop.core.profile import ModelInfo
from pitstop.errors import PitstopError

TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3_text", "mpt", "bloom"}  # tie the output embedding unless told
GPT2_STYLE = {"gpt2", "gpt_neo", "gpt_bigcode"}
QKV_BIAS = {"qwen2", "qwen2_moe"}
# families whose MLP is fc1 -> GELU -> fc2 (no gate): the layer saves half the gated MLP's activations
NON_GATED_MLP = {
    "gpt2", "gpt_neo", "gpt_bigcode", "gptj", "gpt_neox", "mpt", "falcon", "bloom", "phi", "opt", "codegen",
    "starcoder2", "persimmon",
}  # fmt: skip
LAYER_NORM = (
    NON_GATED_MLP  # the same families run LayerNorm (autocast upcasts it to fp32), the others RMSNorm
)
# the standard names Transformers' attribute_map gives each family's own keys (model_type -> {standard: own})
ATTRIBUTE_MAP: dict[str, dict[str, str]] = {
    "mpt": {"hidden_size": "d_model", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads"},
    "bloom": {"num_hidden_layers": "n_layer", "num_attention_heads": "n_head", "hidden_size": "n_embed"},
    "falcon": {"num_hidden_layers": "n_layer", "num_attention_heads": "n_head"},
    "gpt2": {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head"},
    "gptj": {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head"},
    "codegen": {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head"},
    "opt": {"intermediate_size": "ffn_dim"},
}
ENCODER_DECODER = {
    "t5",
    "mt5",
    "umt5",
    "bart",
    "mbart",
    "pegasus",
    "marian",
    "led",
    "longt5",
    "switch_transformers",
}


class ModelConfigError(PitstopError, ValueError):
    pass


CONFIG_LIMIT = 64 * 2**20  # a config.json is a few KB; refuse to slurp anything that is not one
MAX_DIM = 2**24  # no hidden size, layer count, head count or vocabulary is larger


def load_model_config(source: str | Path) -> dict[str, Any]:
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():  # is_file follows links and is False for FIFOs and devices
        raise ModelConfigError(f"{source}: no such config.json")
    if path.stat().st_size == 0:  # empty, or a /proc pseudo-file that may block on read
        raise ModelConfigError(f"{path}: empty file (or a pseudo-file), not a model config")
    if path.stat().st_size > CONFIG_LIMIT:
        raise ModelConfigError(f"{path}: larger than {CONFIG_LIMIT // 2**20} MiB, which no model config is")
    try:
        with path.open("rb") as f:
            data = json.loads(f.read(CONFIG_LIMIT + 1))
    except RecursionError:
        raise ModelConfigError(f"{path}: not a JSON config (nested too deeply)") from None
    except (OSError, ValueError) as exc:
        raise ModelConfigError(f"{path}: not a JSON config ({exc})") from None
    if not isinstance(data, dict) or not {"hidden_size", "n_embd", "d_model"} & set(data):
        raise ModelConfigError(f"{path}: not a model config (no hidden_size)")
    return data


def standard_keys(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The config with its family's own keys also under the standard names (Transformers' attribute_map),
    MPT's ``expansion_ratio`` as an intermediate size and Falcon's kv-head options as a kv-head count;
    refuses an encoder-decoder model in one line."""
    model_type = str(cfg.get("model_type") or "")
    if cfg.get("is_encoder_decoder") or model_type in ENCODER_DECODER:
        raise ModelConfigError(
            f"{model_type or 'this model'} is an encoder-decoder model: pitstop plans decoder-only models"
        )
    out = dict(cfg)
    for standard, own in ATTRIBUTE_MAP.get(model_type, {}).items():
        if out.get(standard) is None and cfg.get(own) is not None:
            out[standard] = cfg[own]
    d = out.get("hidden_size")
    if model_type == "mpt" and out.get("intermediate_size") is None and isinstance(d, int):
        ratio = cfg.get("expansion_ratio", 4)
        if isinstance(ratio, int | float) and not isinstance(ratio, bool) and ratio > 0:
            out["intermediate_size"] = int(ratio * d)
    if model_type == "falcon":
        if out.get("intermediate_size") is None and out.get("ffn_hidden_size") is not None:
            out["intermediate_size"] = out["ffn_hidden_size"]
        if out.get("num_key_value_heads") is None:
            if cfg.get("new_decoder_architecture") and cfg.get("num_kv_heads") is not None:
                out["num_key_value_heads"] = cfg["num_kv_heads"]
            elif cfg.get("multi_query", True) and not cfg.get("new_decoder_architecture"):
                out["num_key_value_heads"] = 1
    return out


def mlp_gated(model_type: str | None) -> bool:
    """Whether the family's MLP is gated (SwiGLU's gate, up, down) rather than fc1 -> GELU -> fc2."""
    return (model_type or "") not in NON_GATED_MLP


def norm_kind(model_type: str | None, config: Mapping[str, Any] | None = None) -> str:
    """``rms`` (Hugging Face's RMSNorm upcasts to fp32 whatever the precision), ``layer`` (LayerNorm: fp32
    under autocast, bf16 in a pure-bf16 model) or ``low_precision`` (MPT's low_precision_layernorm, its
    config's default: bf16 even under autocast)."""
    model_type = model_type or ""
    if model_type == "mpt":
        norm = str((config or {}).get("norm_type") or "low_precision_layernorm")
        return "low_precision" if norm.startswith("low_precision") else "layer"
    return "layer" if model_type in LAYER_NORM else "rms"


def _get(cfg: Mapping[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if cfg.get(name) is not None:
            return cfg[name]
    return default


def _count(cfg: Mapping[str, Any], *names: str, default: int | None = None, minimum: int = 1) -> int:
    """A whole-number field of the config, checked (a config is user input: one line, never a traceback)."""
    value = _get(cfg, *names, default=default)
    if value is None:
        raise ModelConfigError(f"no usable {' / '.join(names)} in the model config")
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value != int(value)
        or not minimum <= value <= MAX_DIM
    ):
        shown = repr(value)[:40]
        raise ModelConfigError(
            f"the model config's {names[0]} is {shown}, not a whole number from {minimum} to {MAX_DIM:,}"
        )
    return int(value)


def model_info_from_config(config: Mapping[str, Any]) -> ModelInfo:
    """The model's shape (``profile.ModelInfo``, the one shape type) from a decoder-only model's config, with
    its parameter counts by construction (module doc)."""
    cfg = config.get("text_config") or config
    if not isinstance(cfg, Mapping):
        raise ModelConfigError(f"text_config is {type(cfg).__name__}, not an object")
    if cfg is not config:
        standard_keys(config)  # refuses an encoder-decoder outer config
    cfg = standard_keys(cfg)
    shape = _shape(cfg)
    total, embedding, inactive = _formula_counts(shape, cfg)
    return replace(
        shape,
        params_total=total,
        params_trainable=total,
        params_embedding=embedding,
        params_inactive=inactive if shape.n_experts else None,
    )


def _shape(cfg: Mapping[str, Any]) -> ModelInfo:
    """The dimensions a config gives, checked (``n_experts`` and ``experts_active`` stay None when dense)."""
    model_type = str(cfg.get("model_type") or "")
    d = _count(cfg, "hidden_size", "n_embd")
    heads = _count(cfg, "num_attention_heads", "n_head")
    if cfg.get("head_dim") is None and d < heads:
        raise ModelConfigError(f"{heads} attention heads for a hidden size of {d}: no head dimension")
    tied = cfg.get("tie_word_embeddings")
    if tied is None:
        tied = model_type in TIED_BY_DEFAULT or model_type in GPT2_STYLE
    experts = _count(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0, minimum=0)
    inter = _count(cfg, "intermediate_size", "n_inner", default=4 * d)
    layers = _count(cfg, "num_hidden_layers", "n_layer")
    head_dim = _count(cfg, "head_dim", default=d // heads)
    kv_heads = _count(cfg, "num_key_value_heads", default=heads)
    vocab = _count(cfg, "vocab_size")
    active = min(_count(cfg, "num_experts_per_tok", "moe_topk", default=1), max(experts, 1))
    return ModelInfo(
        model_type=model_type or None,
        n_layers=layers,
        hidden_size=d,
        n_heads=heads,
        head_dim=head_dim,
        vocab_size=vocab,
        intermediate_size=inter,
        n_kv_heads=kv_heads,
        tied_embeddings=bool(tied),
        n_experts=experts or None,
        experts_active=active if experts else None,
    )


def _n(value: int | None) -> int:
    return value or 0


def _formula_counts(m: ModelInfo, cfg: Mapping[str, Any]) -> tuple[int, int, int]:
    """(total, embedding, inactive expert) parameters by construction: what the family's modules hold
    (module doc). ``cfg`` gives what only the count needs: MoE expert width, attention biases, learned
    absolute positions (GPT-2 style)."""
    d, layers, vocab = _n(m.hidden_size), _n(m.n_layers), _n(m.vocab_size)
    inter, head_dim = _n(m.intermediate_size), _n(m.head_dim)
    experts, active = _n(m.n_experts), m.experts_active or 1
    model_type = m.model_type or ""
    expert_inter = _count(cfg, "moe_intermediate_size", default=inter) if experts else 0
    attention_bias = bool(cfg.get("attention_bias"))
    embedding = vocab * d
    expert_params = 0
    if model_type in GPT2_STYLE:
        positions = _count(cfg, "n_positions", "max_position_embeddings", default=1024)
        per_layer = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (d * inter + inter) + (inter * d + d)
        embedding += positions * d
        total = embedding + layers * per_layer + 2 * d
    else:
        q_out, kv_out = _n(m.n_heads) * head_dim, _n(m.n_kv_heads) * head_dim
        attn = d * q_out + 2 * d * kv_out + q_out * d
        if attention_bias or model_type in QKV_BIAS:  # q/k/v biases; o_proj's only if asked
            attn += q_out + 2 * kv_out + (d if attention_bias else 0)
        if model_type.startswith("qwen3"):
            attn += 2 * head_dim  # q_norm and k_norm
        mlp = (3 if mlp_gated(model_type) else 2) * d * inter
        if experts:
            expert_params = layers * experts * 3 * d * expert_inter
            mlp = experts * 3 * d * expert_inter + d * experts
        norms = 4 * d if model_type in ("gemma2", "gemma3_text") else 2 * d  # + post-ff norms
        total = embedding + layers * (attn + mlp + norms) + d
    if not m.tied_embeddings:
        total += vocab * d
    inactive = expert_params * (experts - active) // experts if experts else 0
    return total, embedding, inactive
