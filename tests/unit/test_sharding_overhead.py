"""sharding_overhead: ZeRO / FSDP where the planner says a full replica (DDP) fits and the measured sharding
cost (the framework's hooks, the exposed communication) beyond DDP's modelled all-reduce is material. Rules on
hand-made profiles; the remedy's advice per framework; the record's JSON round trip; the collector's patch
targets against the installed torch and DeepSpeed."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
from tests.factories import LLAMA_1B, profile, steps

from pitstop.core.findings import Finding
from pitstop.core.profile import (
    Checkpointing,
    CollectiveRecord,
    ModelInfo,
    RankProfile,
    RunProfile,
    ShardingStats,
)
from pitstop.core.vocabulary import CauseId, Framework
from pitstop.diagnose import diagnose
from pitstop.diagnose.causes import CAUSES
from pitstop.diagnose.causes.sharding_overhead import ddp_buckets
from pitstop.interconnect import LINKS
from pitstop.plan.comm import comm_per_step
from pitstop.remedies import RemedyId, advise, remedy, use
from pitstop.remedies.base import TrialFacts

SMALL = ModelInfo(params_total=150_000_000, params_trainable=150_000_000)  # no shape: model states only
BIG = ModelInfo(params_total=13_000_000_000, params_trainable=13_000_000_000)


def _stats(hook_s_per_step: float, n_steps: int = 20, framework: str = "fsdp2") -> ShardingStats:
    return ShardingStats(
        framework=framework,
        strategy="full_shard",
        units=401,
        param_tensors=2403,
        small_tensors=1603,
        small_elements=65_536,
        param_bytes=300_000_000,
        grad_bytes=300_000_000,
        hook_s=hook_s_per_step * n_steps,
        hook_calls=1604 * n_steps,
        steps=n_steps,
        memory_bytes=None,
    )


def _gpu_run(hook_s: float | None, model: ModelInfo = SMALL, gpus: int = 8, **env: object) -> RunProfile:
    env = {"fsdp_sharding": "full_shard", **env}
    run = profile("cuda", steps(wall=0.5), util=90.0, ranks=2, world_size=gpus, model=model, **env)
    for rank in run.ranks:
        rank.sharding = None if hook_s is None else _stats(hook_s)
    return run


def _found(run: RunProfile, cause: str = "sharding_overhead") -> Finding | None:
    return next((f for f in diagnose(run).findings if f.cause == cause), None)


def test_fsdp_where_ddp_fits_with_busy_hooks_is_named_with_its_evidence() -> None:
    finding = _found(_gpu_run(0.2, framework="accelerate"))
    assert finding is not None
    ev = finding.evidence
    assert ev["strategy"] == "full_shard" and ev["sharded_by"] == "fsdp2" and ev["world_size"] == 8
    assert ev["param_tensors"] == 2403 and ev["small_tensors"] == 1603 and ev["units"] == 401
    assert ev["ddp_buckets_est"] == ddp_buckets(300e6) == 13  # 1 MB, then 25 MB buckets
    assert ev["hook_ms_per_step"] == pytest.approx(200.0)
    # DDP's all-reduce of the same 300 MB of gradients at the H100's NVLink, plan/comm's model
    ddp = comm_per_step("no_shard", 0.0, 300e6, 8, 1, LINKS["nvlink4"], LINKS["nvlink4"])
    assert ev["ddp_comm_ms_per_step_est"] == pytest.approx(ddp.seconds * 1000, abs=1e-3)
    assert ev["ddp_link"] == "plan/comm's link"
    gib = ev["plan_gib_per_rank"]
    assert isinstance(gib, dict) and gib["full_shard"] < gib["ddp"] < 0.6 * 80
    saved = 0.2 - ddp.seconds
    assert ev["saved_ms_per_step_est"] == pytest.approx(saved * 1000, abs=0.01)
    assert finding.est_speedup == pytest.approx(1 / (1 - saved / 0.5), rel=1e-3)
    assert "hooks" in finding.speedup_basis and finding.confidence == 0.75
    assert finding.fix.uses[0].remedy is RemedyId.PLAIN_DDP
    assert "distributed_type: MULTI_GPU" in finding.fix.snippets["accelerate"]


def test_sharding_that_memory_needs_cheap_hooks_ddp_and_one_rank_are_not_named() -> None:
    assert _found(_gpu_run(0.2, model=dataclasses.replace(BIG))) is None  # 13B: DDP needs 208 GB a GPU
    assert _found(_gpu_run(0.005)) is None  # 5 ms of hooks in a 500 ms step: not material
    assert _found(_gpu_run(None)) is None  # nothing measured: no ranks' collectives, no hooks
    assert _found(_gpu_run(0.2, fsdp_sharding="no_shard")) is None
    one = _gpu_run(0.2, gpus=1)
    one.ranks = one.ranks[:1]
    assert _found(one) is None


def test_zero3_with_the_full_shape_uses_the_whole_step_and_defers_oversharded() -> None:
    # a 1.2B Llama on 8 H100s: DDP's whole step fits; ZeRO-3's third pass is oversharded's argument, the same
    # seconds: only the measured finding stays
    llama = dataclasses.replace(LLAMA_1B, intermediate_size=8192, n_kv_heads=8)
    run = _gpu_run(0.2, model=llama, fsdp_sharding=None, zero_stage=3)
    for rank in run.ranks:
        assert rank.sharding is not None
        rank.sharding = dataclasses.replace(rank.sharding, framework="deepspeed", strategy="zero3")
    found = [f.cause for f in diagnose(run).findings]
    assert "sharding_overhead" in found and "oversharded" not in found
    finding = _found(run)
    assert finding is not None and finding.evidence["fit_basis"] == "whole step (planner)"
    assert '"stage": 0' in finding.fix.snippets["deepspeed"]
    # without the hooks' time the configuration's traffic argument is oversharded's again
    assert "oversharded" in [f.cause for f in diagnose(_gpu_run(None, model=LLAMA_1B, zero_stage=3)).findings]


def _cpu_rank(rank: int, regathers: int = 0) -> RankProfile:
    """A gloo rank: 4 steps of 0.4 s, 60 all-gathers of 8 KB each a step (1 or 3 ms each) and hooks of 0.3 s."""
    records = steps(n=4, wall=0.4)
    collectives = []
    seq = 0
    for step in records:
        t = step.index * 10.0
        for i in range(60):
            start, took = t + i * 0.004, 0.001 if i % 2 else 0.003
            collectives.append(
                CollectiveRecord(
                    step=step.index,
                    op="all_gather",
                    group="0,1",
                    seq=seq,
                    bytes=8192,
                    size=2,
                    issued_t=start,
                    done_t=start + took,
                    blocked_s=took,
                )
            )
            seq += 1
        step.collectives = 60
    p = profile("cpu", records, world_size=2, model=dataclasses.replace(SMALL)).ranks[0]
    p.rank, p.collectives = rank, collectives
    p.sharding = dataclasses.replace(_stats(0.3, n_steps=4), memory_bytes=16 * 2**30, grad_bytes=100_000)
    if regathers:
        p.checkpointing = Checkpointing(reentrant=4 * 4, regathers=regathers)
    return p


def test_a_cpu_run_prices_ddp_at_the_jobs_own_latency_and_rate_and_leaves_reentrant_repeats_out() -> None:
    run = RunProfile(source="test", ranks=[_cpu_rank(0), _cpu_rank(1)])
    finding = _found(run)
    assert finding is not None
    ev = finding.evidence
    assert ev["collectives_per_step"] == 60 and ev["ddp_buckets_est"] == 1
    assert ev["memory_gib"] == 16.0 and str(ev["ddp_link"]).startswith("the job's own 2.00 ms a collective")
    # every rank arrives together, so a call's exposed time is its whole time: 1 or 3 ms, 2 ms a call on the
    # mean; DDP's one bucket at that, plus its 100 KB all-reduce (× 2 × 1/2 on the bus) at 1 GB/s
    assert ev["ddp_comm_ms_per_step_est"] == pytest.approx((0.002 + 100_000 / 1e9) * 1000, rel=1e-3)
    assert "upper bound" in finding.speedup_basis
    # the same job whose reentrant checkpoints repeat 2 all-gathers a step: those 4 ms are not counted here
    again = RunProfile(source="test", ranks=[_cpu_rank(0, regathers=8), _cpu_rank(1, regathers=8)])
    other = _found(again)
    assert other is not None and other.evidence["reentrant_regather_ms_per_step"] == pytest.approx(4.0)
    assert other.evidence["saved_ms_per_step_est"] == pytest.approx(ev["saved_ms_per_step_est"] - 4.0)
    # plain DDP: no sharding framework seen, none configured, the same collectives: not named
    ddp = RunProfile(source="test", ranks=[_cpu_rank(0), _cpu_rank(1)])
    for rank in ddp.ranks:
        rank.sharding = None
    assert _found(ddp) is None


def test_the_record_reads_back_from_json() -> None:
    run = RunProfile(source="test", ranks=[_cpu_rank(0)])
    back = RunProfile.from_dict(run.to_dict())
    assert back.ranks[0].sharding == run.ranks[0].sharding
    assert RunProfile.from_dict(profile("cpu").to_dict()).ranks[0].sharding is None


def test_the_remedys_advice_per_framework() -> None:
    r = remedy(RemedyId.PLAIN_DDP)
    assert r.preserves_computation and not r.tunable
    assert CAUSES[CauseId.SHARDING_OVERHEAD].remedies == (r.id,)
    facts = TrialFacts(on_gpu=True, hf_model=True, framework=Framework.HF_TRAINER, examples_are_text=False)
    assert "cannot swap it for DDP" in (r.cannot_try(facts) or "")
    fsdp = {"current": "full_shard", "fsdp2": True, "ddp_gib": 3.2, "saved_ms": 120.0}
    pt = r.advice(Framework.PYTORCH, fsdp)
    assert "DistributedDataParallel(model" in pt.snippet and "fully_shard(block)" in pt.snippet
    assert "3.2 GiB" in pt.text and "120.0 ms" in pt.text
    assert "FullyShardedDataParallel(model" in r.advice(Framework.PYTORCH, {}).snippet
    assert "without fsdp=" in r.advice(Framework.HF_TRAINER, fsdp).snippet
    ds = {"current": "zero3", "deepspeed": True}
    assert (
        "without deepspeed=" in r.advice(Framework.TRL, ds).snippet
        and "SFTConfig" in r.advice(Framework.TRL, ds).snippet
    )
    assert '"stage": 0' in r.advice(Framework.DEEPSPEED, ds).snippet
    assert 'strategy="ddp"' in r.advice(Framework.LIGHTNING, ds).snippet
    assert "MULTI_GPU" in r.advice(Framework.ACCELERATE, ds).snippet
    fix = advise("pytorch", use(RemedyId.PLAIN_DDP, **fsdp))
    assert "plain DDP" in fix.text


def test_the_collectors_patch_targets_exist_in_the_installed_libraries() -> None:
    """The hooks are patched by name: a rename in torch or DeepSpeed must fail here, not go unmeasured."""
    from pitstop.probe.collectors.sharding import TARGETS

    for name, (owner, functions, framework) in TARGETS.items():
        if framework == "deepspeed":
            pytest.importorskip("deepspeed")
        module = importlib.import_module(name)
        holder = getattr(module, owner) if owner else module
        for function in functions:
            assert callable(getattr(holder, function, None)), f"{name}.{owner}.{function}"
