"""A model's shape and parameter counts from its Hugging Face ``config.json``, without instantiating it.

Covers the decoder-only families people fine-tune: Llama-style (Llama, Mistral, Mixtral, Qwen2/2.5/3,
Gemma/Gemma 2, Phi-3, SmolLM, ...) and GPT-2-style. Counts follow the modules those models build: gated
MLPs (gate, up, down), grouped-query attention, biases where the config or family has them, RMSNorm /
LayerNorm weights, MoE experts and router, tied or separate output embeddings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pitstop.errors import PitstopError
from pitstop.profile import ModelInfo

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


def _get(cfg: dict[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if cfg.get(name) is not None:
            return cfg[name]
    return default


def _checked(cfg: dict[str, Any]) -> None:
    """Refuse, in one line, a config whose sizes are not positive whole numbers (0 heads, "abc", -2 layers,
    NaN): the counts below divide by them and multiply them."""
    keys = (
        "hidden_size",
        "n_embd",
        "num_hidden_layers",
        "n_layer",
        "num_attention_heads",
        "n_head",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "intermediate_size",
        "n_inner",
        "n_positions",
        "max_position_embeddings",
        "num_local_experts",
        "num_experts",
        "moe_intermediate_size",
    )
    optional_zero = {"num_local_experts", "num_experts"}
    for key in keys:
        value = cfg.get(key)
        if value is None:
            continue
        whole = isinstance(value, int) and not isinstance(value, bool)
        low = 0 if key in optional_zero else 1
        if not whole or not low <= value <= MAX_DIM:
            shown = repr(value)[:40]
            raise ModelConfigError(f"{key} is {shown}, not a whole number from {low} to {MAX_DIM:,}")
    for group in (("hidden_size", "n_embd"), ("num_hidden_layers", "n_layer"), ("vocab_size",)):
        if all(cfg.get(key) is None for key in group):
            raise ModelConfigError(f"no usable {group[0]}: not a decoder model config pitstop can count")
    if all(cfg.get(key) is None for key in ("num_attention_heads", "n_head")):
        raise ModelConfigError("no num_attention_heads: not a decoder model config pitstop can count")
    d, heads = _get(cfg, "hidden_size", "n_embd"), _get(cfg, "num_attention_heads", "n_head")
    if cfg.get("head_dim") is None and d < heads:
        raise ModelConfigError(f"{heads} attention heads for a hidden size of {d}: no head dimension")
    if str(cfg.get("model_type") or "") not in GPT2_STYLE and all(
        cfg.get(key) is None for key in ("intermediate_size", "n_inner")
    ):
        raise ModelConfigError("no intermediate_size: not a decoder model config pitstop can count")


def model_info_from_config(cfg: dict[str, Any]) -> ModelInfo:
    """Shape and exact-by-construction parameter counts for a decoder-only model config."""
    text = cfg.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ModelConfigError(f"text_config is {type(text).__name__}, not an object")
    cfg = text or cfg
    _checked(cfg)
    model_type = str(cfg.get("model_type") or "")
    d = int(_get(cfg, "hidden_size", "n_embd"))
    layers = int(_get(cfg, "num_hidden_layers", "n_layer"))
    heads = int(_get(cfg, "num_attention_heads", "n_head"))
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_get(cfg, "head_dim", default=d // heads))
    vocab = int(_get(cfg, "vocab_size"))
    tied = cfg.get("tie_word_embeddings")
    if tied is None:
        tied = model_type in TIED_BY_DEFAULT or model_type in GPT2_STYLE
    embedding = vocab * d
    if model_type in GPT2_STYLE:
        positions = int(_get(cfg, "n_positions", "max_position_embeddings", default=1024))
        inner = int(_get(cfg, "n_inner", default=4 * d) or 4 * d)
        per_layer = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (d * inner + inner) + (inner * d + d)
        embedding += positions * d
        total = embedding + layers * per_layer + 2 * d
    else:
        inter = int(_get(cfg, "intermediate_size", "n_inner"))
        q_out, kv_out = heads * head_dim, kv_heads * head_dim
        attn = d * q_out + 2 * d * kv_out + q_out * d
        if cfg.get("attention_bias") or model_type in QKV_BIAS:
            attn += q_out + 2 * kv_out + (d if cfg.get("attention_bias") else 0)
        if model_type.startswith("qwen3"):
            attn += 2 * head_dim  # q_norm and k_norm
        experts = int(_get(cfg, "num_local_experts", "num_experts", default=0) or 0)
        mlp = 3 * d * inter
        if experts:
            expert_inter = int(_get(cfg, "moe_intermediate_size", default=inter))
            mlp = experts * 3 * d * expert_inter + d * experts
        norms = 2 * d
        if model_type in ("gemma2", "gemma3_text"):
            norms = 4 * d  # pre- and post-feedforward norms too
        total = embedding + layers * (attn + mlp + norms) + d
    if not tied:
        total += vocab * d
    return ModelInfo(
        model_type=model_type or None,
        n_layers=layers,
        hidden_size=d,
        n_heads=heads,
        head_dim=head_dim,
        vocab_size=vocab,
        tied_embeddings=bool(tied),
        params_total=total,
        params_trainable=total,
        params_embedding=embedding,
    )
