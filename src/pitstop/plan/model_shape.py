"""A model's shape and parameter counts from its Hugging Face ``config.json``, without instantiating it.

Covers the decoder-only families people fine-tune: Llama-style (Llama, Mistral, Mixtral, Qwen2/2.5/3,
Gemma/Gemma 2, Phi-3, SmolLM, ...) and GPT-2-style. Counts follow the modules those models build: gated
MLPs (gate, up, down), grouped-query attention, biases where the config or family has them, RMSNorm /
LayerNorm weights, MoE experts and router, tied or separate output embeddings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a decoder-only model, parsed from its config in one place (``from_config``).

    ``experts`` is 0 for a dense model; a mixture-of-experts layer has ``experts`` MLPs of width
    ``expert_intermediate`` of which a token goes through ``experts_active``.
    """

    layers: int
    hidden: int
    intermediate: int
    heads: int
    head_dim: int
    kv_heads: int
    vocab: int
    model_type: str | None = None
    tied: bool = False
    experts: int = 0
    experts_active: int = 1
    expert_intermediate: int = 0
    attention_bias: bool = False
    positions: int = 0  # learned absolute positions (GPT-2 style); 0 for rotary models

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        cfg = config.get("text_config") or config
        if not isinstance(cfg, Mapping):
            raise ModelConfigError(f"text_config is {type(cfg).__name__}, not an object")
        model_type = str(cfg.get("model_type") or "")
        d = _count(cfg, "hidden_size", "n_embd")
        heads = _count(cfg, "num_attention_heads", "n_head")
        if cfg.get("head_dim") is None and d < heads:
            raise ModelConfigError(f"{heads} attention heads for a hidden size of {d}: no head dimension")
        gpt2 = model_type in GPT2_STYLE
        tied = cfg.get("tie_word_embeddings")
        if tied is None:
            tied = model_type in TIED_BY_DEFAULT or gpt2
        experts = _count(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0, minimum=0)
        inter = _count(cfg, "intermediate_size", "n_inner", default=4 * d)
        return cls(
            layers=_count(cfg, "num_hidden_layers", "n_layer"),
            hidden=d,
            intermediate=inter,
            heads=heads,
            head_dim=_count(cfg, "head_dim", default=d // heads),
            kv_heads=_count(cfg, "num_key_value_heads", default=heads),
            vocab=_count(cfg, "vocab_size"),
            model_type=model_type or None,
            tied=bool(tied),
            experts=experts,
            experts_active=min(_count(cfg, "num_experts_per_tok", "moe_topk", default=1), max(experts, 1)),
            expert_intermediate=_count(cfg, "moe_intermediate_size", default=inter) if experts else 0,
            attention_bias=bool(cfg.get("attention_bias")),
            positions=_count(cfg, "n_positions", "max_position_embeddings", default=1024) if gpt2 else 0,
        )

    @property
    def is_gpt2_style(self) -> bool:
        return self.positions > 0

    def counts(self) -> ParamCountsByFormula:
        """Parameter counts by construction: what the family's modules hold (module doc)."""
        d, layers, vocab = self.hidden, self.layers, self.vocab
        embedding = vocab * d
        expert_params = 0
        if self.is_gpt2_style:
            inner = self.intermediate
            per_layer = (
                2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (d * inner + inner) + (inner * d + d)
            )
            embedding += self.positions * d
            total = embedding + layers * per_layer + 2 * d
        else:
            q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
            attn = d * q_out + 2 * d * kv_out + q_out * d
            if self.attention_bias or self.model_type in QKV_BIAS:  # q/k/v biases; o_proj's only if asked
                attn += q_out + 2 * kv_out + (d if self.attention_bias else 0)
            if (self.model_type or "").startswith("qwen3"):
                attn += 2 * self.head_dim  # q_norm and k_norm
            mlp = 3 * d * self.intermediate
            if self.experts:
                expert_params = layers * self.experts * 3 * d * self.expert_intermediate
                mlp = self.experts * 3 * d * self.expert_intermediate + d * self.experts
            norms = 4 * d if self.model_type in ("gemma2", "gemma3_text") else 2 * d  # + post-ff norms
            total = embedding + layers * (attn + mlp + norms) + d
        if not self.tied:
            total += vocab * d
        inactive = expert_params * (self.experts - self.experts_active) // self.experts if self.experts else 0
        return ParamCountsByFormula(total=total, embedding=embedding, inactive=inactive)

    def model_info(self) -> ModelInfo:
        """The FLOPs model's view of this shape, with its parameter counts by formula."""
        counts = self.counts()
        return ModelInfo(
            model_type=self.model_type,
            n_layers=self.layers,
            hidden_size=self.hidden,
            n_heads=self.heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab,
            intermediate_size=self.intermediate,
            n_kv_heads=self.kv_heads,
            tied_embeddings=self.tied,
            params_total=counts.total,
            params_trainable=counts.total,
            params_embedding=counts.embedding,
            n_experts=self.experts or None,
            experts_active=self.experts_active if self.experts else None,
            params_inactive=counts.inactive if self.experts else None,
        )


@dataclass(frozen=True)
class ParamCountsByFormula:
    total: int
    embedding: int
    inactive: int  # expert weights a token does not pass through


def model_info_from_config(cfg: Mapping[str, Any]) -> ModelInfo:
    """Shape and exact-by-construction parameter counts for a decoder-only model config."""
    return ModelShape.from_config(cfg).model_info()
