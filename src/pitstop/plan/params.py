"""Exact parameter counts: instantiate the model on the meta device (no memory, ~1 s even for 70B).

Counting the modules a model actually builds is exact for every architecture transformers knows, LoRA
included (peft applied to the meta model gives its exact trainable count). Where transformers is missing or
does not know the model type, the analytic count of ``model_shape`` is used and said to be so.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from pitstop.core.profile import ModelInfo
from pitstop.plan.model_shape import ModelConfigError, load_model_config, model_info_from_config


@dataclass
class ParamCounts:
    total: int
    embedding: int
    trainable: int
    largest_module: int  # the biggest single module's own parameters (what ZeRO-3 gathers at once)
    exact: bool  # counted from the built model, not from a formula
    inactive: int = 0  # mixture-of-experts weights a token does not pass through ((E - k) / E of them)

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding


def presets() -> dict[str, dict[str, Any]]:
    text = resources.files("pitstop.plan").joinpath("presets.json").read_text()
    return dict(json.loads(text))


def resolve_model(spec: str | Path) -> tuple[str, dict[str, Any]]:
    """(name, config dict) from a preset name, a config.json, or a model folder."""
    known = presets()
    key = str(spec).lower()
    if key in known:
        return key, {k: v for k, v in known[key].items() if not k.startswith("_")}
    path = Path(spec)
    if path.exists():
        return path.stem if path.is_file() else path.name, load_model_config(path)
    raise ModelConfigError(
        f"{spec}: neither a config.json, a model folder, nor a preset ({', '.join(sorted(known))})"
    )


def _meta_model(config: dict[str, Any]) -> Any:
    import torch
    import transformers

    cfg = transformers.AutoConfig.for_model(**config)
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        return transformers.AutoModelForCausalLM.from_config(cfg)


def count_params(
    config: dict[str, Any], method: str = "full", rank: int = 16, targets: str | list[str] = "all-linear"
) -> ParamCounts:
    """Total, embedding, trainable and largest-module parameter counts for full / LoRA / QLoRA training
    (remembered per config: building a large model on the meta device takes seconds, and ``--seq auto``,
    the alternatives and a table of plans ask for the same model again)."""
    key = json.dumps(config, sort_keys=True, default=str)
    return replace(_count_params_cached(key, method, rank, json.dumps(targets)))


@lru_cache(maxsize=64)
def _count_params_cached(key: str, method: str, rank: int, targets: str) -> ParamCounts:
    return _count_params(json.loads(key), method, rank, json.loads(targets))


def _count_params(config: dict[str, Any], method: str, rank: int, targets: str | list[str]) -> ParamCounts:
    shape = model_info_from_config(config)
    try:
        model = _meta_model(config)
    except Exception:
        return _analytic(shape, method, rank)
    embed = model.get_input_embeddings()
    embedding = embed.weight.numel() if embed is not None else 0
    total = sum(p.numel() for p in model.parameters())
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    experts = sum(
        p.numel()
        for name, m in model.named_modules()
        if name.rsplit(".", 1)[-1] == "experts"
        for p in m.parameters()
    )
    n_experts, active = shape.n_experts or 0, shape.experts_active or 1
    inactive = experts * (n_experts - active) // n_experts if n_experts else 0
    trainable = total
    if method in ("lora", "qlora"):
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError:
            raise ModelConfigError("LoRA planning needs peft: pip install 'pitstop[hf]'") from None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            peft_model = get_peft_model(model, LoraConfig(r=rank, target_modules=targets))
        trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    return ParamCounts(
        total=total,
        embedding=embedding,
        trainable=trainable,
        largest_module=largest,
        exact=True,
        inactive=inactive,
    )


def _analytic(shape: ModelInfo, method: str, rank: int) -> ParamCounts:
    """The counts by formula of a shape read from a config (``model_info_from_config`` fills every field)."""
    total, embedding = shape.params_total or 0, shape.params_embedding or 0
    trainable = total
    if method in ("lora", "qlora"):
        head_dim = shape.head_dim or 0
        q = (shape.n_heads or 0) * head_dim
        kv = (shape.n_kv_heads or 0) * head_dim
        d, inter = shape.hidden_size or 0, shape.intermediate_size or 0
        per_layer = rank * ((d + q) + 2 * (d + kv) + (q + d) + 2 * (d + inter) + (inter + d))
        trainable = (shape.n_layers or 0) * per_layer
    return ParamCounts(
        total=total,
        embedding=embedding,
        trainable=trainable,
        largest_module=max(embedding, 1),
        exact=False,
        inactive=shape.params_inactive or 0,
    )
