"""Simulating one real training step on fake tensors, to measure what it would hold in memory.

The model is built from its config under ``FakeTensorMode`` (tensors carry shapes and dtypes, no storage),
and one step — forward, loss, backward, optimizer — runs twice; the second is watched by torch's
``MemTracker``, so optimizer states already exist, as they do in steady state. Nothing is allocated: a CPU
machine simulates an 80 GB GPU's step in about a second.

To stay fast for deep models the step is simulated with one and two layers; every figure that grows with
depth is extrapolated linearly from the difference (activations of a layer do not depend on the others).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any


@dataclass
class SimulatedStep:
    """Peak bytes by category for the whole model, extrapolated to its real depth."""

    params: float
    grads: float
    optimizer: float
    activations: float
    temporaries: float  # held at the end of the forward pass besides activations (the loss's fp32 logits)
    per_layer_activations: float
    peak: float  # the step's peak, all categories together


def _peak(
    config: dict[str, Any],
    layers: int,
    micro_batch: int,
    seq: int,
    attn: str,
    checkpointing: bool,
    lora_rank: int | None,
) -> dict[str, float]:
    import torch
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    cfg = transformers.AutoConfig.for_model(**{**config, "num_hidden_layers": layers, "use_cache": False})
    if hasattr(cfg, "layer_types") and cfg.layer_types:
        cfg.layer_types = list(cfg.layer_types)[:layers]
    with warnings.catch_warnings(), FakeTensorMode():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, attn_implementation=attn, dtype=torch.bfloat16
        )
        if lora_rank:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=lora_rank, target_modules="all-linear"))
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        ids = torch.randint(0, cfg.vocab_size, (micro_batch, seq))

        def step(tracker: Any = None) -> dict[str, float]:
            loss = model(input_ids=ids, labels=ids).loss
            held = _by_kind(tracker.get_tracker_snapshot()) if tracker is not None else {}
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return held

        step()
        tracker = MemTracker()
        tracker.track_external(model, optimizer)
        with tracker:
            held = step(tracker)  # what the end of the forward pass holds for backward
        peak = _by_kind(tracker.get_tracker_snapshot("peak"))
    return {
        "ACT": held.get("ACT", 0.0),
        "FWD_TEMP": held.get("TEMP", 0.0),
        **{f"PEAK_{k}": v for k, v in peak.items()},
    }


def _by_kind(snapshot: dict[Any, dict[Any, int]]) -> dict[str, float]:
    by_kind: dict[str, float] = {}
    for per_device in snapshot.values():
        for kind, value in per_device.items():
            name = str(kind).rsplit(".", 1)[-1]
            by_kind[name] = by_kind.get(name, 0.0) + float(value)
    return by_kind


def simulate_step(
    config: dict[str, Any],
    micro_batch: int,
    seq: int,
    attn: str = "sdpa",
    checkpointing: bool = False,
    lora_rank: int | None = None,
) -> SimulatedStep:
    """One training step of ``config`` at its full depth, from fake one- and two-layer steps."""
    cfg = config.get("text_config") or config
    depth = int(cfg.get("num_hidden_layers") or cfg.get("n_layer") or 1)
    one = _peak(config, 1, micro_batch, seq, attn, checkpointing, lora_rank)
    two = _peak(config, 2, micro_batch, seq, attn, checkpointing, lora_rank)

    def at_depth(kind: str) -> float:
        return one.get(kind, 0.0) + (depth - 1) * (two.get(kind, 0.0) - one.get(kind, 0.0))

    return SimulatedStep(
        params=at_depth("PEAK_PARAM") + at_depth("PEAK_BUFFER"),
        grads=at_depth("PEAK_GRAD"),
        optimizer=at_depth("PEAK_OPT"),
        activations=at_depth("ACT"),
        temporaries=max(one.get("FWD_TEMP", 0.0), two.get("FWD_TEMP", 0.0)),
        per_layer_activations=two.get("ACT", 0.0) - one.get("ACT", 0.0),
        peak=at_depth("PEAK_Total"),
    )
