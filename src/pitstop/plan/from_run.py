"""The planner's view of a measured run, so `doctor` and `plan` answer memory questions with one model."""

from __future__ import annotations

from pitstop.plan.memory import Setup
from pitstop.plan.model_shape import ModelShape
from pitstop.profile import Environment
from pitstop.vocabulary import Sharding

_ATTENTION = {"flash_attention_2": "flash", "flash_attention_3": "flash", "sdpa": "sdpa", "eager": "eager"}


def setup_for_run(env: Environment, seq: int = 0, gpus: int | None = None) -> Setup | None:
    """A Setup for the run's model and settings, or None when the run did not reveal the model's size.

    Shape fields the run did not reveal are 0: model states need only the parameter counts, activations
    need the shape (``has_shape``).
    """
    model = env.model
    total = model.params_total
    if not total:
        return None
    trainable = model.params_trainable if model.params_trainable is not None else total
    embedding = model.params_embedding or (model.hidden_size or 0) * (model.vocab_size or 0)
    heads = model.n_heads or 0
    shape = ModelShape(
        layers=model.n_layers or 0,
        hidden=model.hidden_size or 0,
        intermediate=model.intermediate_size or 0,
        heads=heads,
        head_dim=model.head_dim or ((model.hidden_size or 0) // heads if heads else 0),
        kv_heads=model.n_kv_heads or heads,
        vocab=model.vocab_size or 0,
    )
    world = max(gpus or env.world_size or 1, 1)
    strategy = Sharding.parse(env.fsdp_sharding)
    zero = strategy.zero_stage if strategy is not None else min(max(env.zero_stage or 0, 0), 3)
    nodes = env.nodes if env.nodes and world % env.nodes == 0 else 1
    hpz = env.zero_hpz or 1
    if strategy is not None or zero != 3 or world % hpz:
        hpz = 1
    return Setup.for_shape(
        shape,
        total_params=total,
        lora_params=trainable,
        embedding_params=embedding,
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
    return all((s.layers, s.hidden, s.intermediate, s.heads, s.head_dim, s.kv_heads, s.vocab, s.seq))
