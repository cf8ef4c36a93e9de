"""A model's shape (``profile.ModelInfo``) and parameter counts from its Hugging Face ``config.json``,
without instantiating it.

Covers the decoder-only families people fine-tune: Llama-style (Llama, Mistral, Mixtral, Qwen2/2.5/3,
Gemma/Gemma 2, Phi-3, SmolLM, ...) and GPT-2-style. Counts follow the modules those models build: gated
MLPs (gate, up, down), grouped-query attention, biases where the config or family has them, RMSNorm /
LayerNorm weights, MoE experts and router, tied or separate output embeddings.
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

TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3_text"}  # families that tie the output embedding unless told
GPT2_STYLE = {"gpt2", "gpt_neo", "gpt_bigcode"}
QKV_BIAS = {"qwen2", "qwen2_moe"}


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
    if not isinstance(data, dict) or ("hidden_size" not in data and "n_embd" not in data):
        raise ModelConfigError(f"{path}: not a model config (no hidden_size)")
    return data


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
        mlp = 3 * d * inter
        if experts:
            expert_params = layers * experts * 3 * d * expert_inter
            mlp = experts * 3 * d * expert_inter + d * experts
        norms = 4 * d if model_type in ("gemma2", "gemma3_text") else 2 * d  # + post-ff norms
        total = embedding + layers * (attn + mlp + norms) + d
    if not m.tied_embeddings:
        total += vocab * d
    inactive = expert_params * (experts - active) // experts if experts else 0
    return total, embedding, inactive
