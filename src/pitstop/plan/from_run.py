"""The planner's view of a measured run, so `doctor` and `plan` answer memory questions with one model."""

from __future__ import annotations

from dataclasses import replace

from pitstop.core.profile import Environment
from pitstop.core.vocabulary import Sharding
from pitstop.plan.memory import Setup

_ATTENTION = {"flash_attention_2": "flash", "flash_attention_3": "flash", "sdpa": "sdpa", "eager": "eager"}


def setup_for_run(env: Environment, seq: int = 0, gpus: int | None = None) -> Setup | None:
    """A Setup for the run's model and settings, or None when the run did not reveal the model's size.

    The setup's model is a copy of the run's ``environment.model`` (the same ``ModelInfo``), its head size
    and key / value heads filled from the others where the run did not say them. Shape fields the run did
    not reveal stay unknown (counted as 0): model states need only the parameter counts, activations need
    the shape (``has_shape``).
    """
    model = env.model
    total = model.params_total
    if not total:
        return None
    trainable = model.params_trainable if model.params_trainable is not None else total
    embedding = model.params_embedding or (model.hidden_size or 0) * (model.vocab_size or 0)
    heads = model.n_heads
    shape = replace(
        model,
        head_dim=model.head_dim or ((model.hidden_size or 0) // heads if heads else None),
        n_kv_heads=model.n_kv_heads or heads,
    )
    world = max(gpus or env.world_size or 1, 1)
    strategy = Sharding.parse(env.fsdp_sharding)
    zero = strategy.zero_stage if strategy is not None else min(max(env.zero_stage or 0, 0), 3)
    nodes = env.nodes if env.nodes and world % env.nodes == 0 else 1
    hpz = env.zero_hpz or 1
    if strategy is not None or zero != 3 or world % hpz:
        hpz = 1
    return Setup(
        model=shape,
        lora_params=trainable,
        largest_module=embedding,  # the embedding is the largest module ZeRO-3 gathers in a decoder
        seq=seq,
        gpus=world,
        zero=zero,
        sharding=None if strategy is None else str(strategy),
        nodes=nodes,
        hpz=hpz,
        method="full" if trainable >= total else "lora",
        attn=_ATTENTION.get(env.attn_implementation or "", "sdpa"),
        checkpointing=bool(env.gradient_checkpointing),
        micro_batch=env.micro_batch_size or 1,
    )


def has_shape(s: Setup) -> bool:
    """Whether the setup knows enough of the model's shape to predict activation memory."""
    m = s.model
    dims = (m.n_layers, m.hidden_size, m.intermediate_size, m.n_heads, m.head_dim, m.n_kv_heads, m.vocab_size)
    return all((*dims, s.seq))
