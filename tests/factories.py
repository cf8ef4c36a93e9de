"""Hand-made RunProfiles for rule tests: every number is chosen, nothing is measured."""

from __future__ import annotations

import dataclasses
from typing import Any

from pitstop.core.profile import (
    AttentionInfo,
    DataLoaderInfo,
    Environment,
    GpuSample,
    ModelInfo,
    RankProfile,
    RunProfile,
    StepRecord,
)

LLAMA_1B = ModelInfo(
    model_type="llama",
    n_layers=16,
    hidden_size=2048,
    n_heads=32,
    head_dim=64,
    vocab_size=128256,
    tied_embeddings=True,
    params_total=1_235_814_400,
    params_trainable=1_235_814_400,
    params_embedding=262_668_288,
)


def steps(
    n: int = 20,
    wall: float = 0.1,
    data: float = 0.0,
    fwd: float | None = None,
    bwd: float | None = None,
    opt: float | None = 0.005,
    rows: int = 8,
    row_len: int = 1024,
    real_frac: float = 1.0,
    syncs: int = 0,
    sync_s: float = 0.0,
    h2d: int = 8 * 1024 * 8 * 3,
) -> list[StepRecord]:
    compute = wall - data - (opt or 0.0)
    fwd = compute / 3 if fwd is None else fwd
    bwd = compute - fwd if bwd is None else bwd
    tokens = rows * row_len
    return [
        StepRecord(
            index=i + 1,
            wall_s=wall,
            data_wait_s=data,
            forward_s=fwd,
            backward_s=bwd,
            optimizer_s=opt,
            micro_batches=1,
            samples=rows,
            tokens=tokens,
            real_tokens=int(tokens * real_frac),
            loss_tokens=int(tokens * real_frac),
            examples=rows,
            seq_len=row_len,
            syncs=syncs,
            sync_s=sync_s,
            h2d_bytes=h2d,
        )
        for i in range(n)
    ]


def gpu_samples(util: float, mem_frac: float = 0.5, n: int = 20, total: int = 80 * 2**30) -> list[GpuSample]:
    return [
        GpuSample(
            t=0.05 * i,
            util=util,
            mem_used=int(total * mem_frac),
            mem_total=total,
            pcie_rx=1e8,
            pcie_tx=1e8,
            sm_clock=1980,
            power_w=400,
        )
        for i in range(n)
    ]


def environment(device: str = "cpu", **overrides: Any) -> Environment:
    env = Environment(
        device=device,
        cpu_count=16,
        framework="hf_trainer",
        model=dataclasses.replace(LLAMA_1B),
        attention=AttentionInfo(implementation="sdpa", sdpa_calls=320, sdpa_calls_with_mask=0),
        param_dtype="bf16" if device == "cuda" else "fp32",
        autocast_dtype=None,
        tf32=True if device == "cuda" else None,
        dataloader=DataLoaderInfo(
            num_workers=4,
            pin_memory=True,
            persistent_workers=True,
            prefetch_factor=2,
            batch_size=8,
            examples_are_text=False,
        ),
        micro_batch_size=8,
        grad_accum_steps=1,
        offload={},
        world_size=1,
    )
    if device == "cuda":
        env.gpu_name = "NVIDIA H100 80GB HBM3"
        env.gpu_count = 1
        env.gpu_memory_bytes = 80 * 2**30
    for key, value in overrides.items():
        setattr(env, key, value)
    return env


def profile(
    device: str = "cpu",
    step_records: list[StepRecord] | None = None,
    util: float | None = None,
    mem_frac: float = 0.5,
    ranks: int = 1,
    **env: Any,
) -> RunProfile:
    rank_profiles = []
    for r in range(ranks):
        rank = RankProfile(
            rank=r, warmup_steps=10, steps=step_records or steps(), environment=environment(device, **env)
        )
        if util is not None:
            rank.gpu_samples = gpu_samples(util, mem_frac)
        rank_profiles.append(rank)
    return RunProfile(source="test", ranks=rank_profiles)


def well_tuned(device: str = "cuda") -> RunProfile:
    """Pre-tokenized, packed, SDPA, bf16, workers, busy GPU: what a good run looks like."""
    return profile(
        device,
        steps(wall=0.15, data=0.001, real_frac=0.99),
        util=97.0 if device == "cuda" else None,
        mem_frac=0.7,
    )
