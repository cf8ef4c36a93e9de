"""Every rule on hand-made RunProfiles: fires on its cause with the right evidence, stays quiet otherwise."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.factories import LLAMA_1B, gpu_samples, profile, steps, well_tuned

from pitstop.core.profile import AttentionInfo, DataLoaderInfo, RunProfile
from pitstop.diagnose import diagnose
from pitstop.diagnose.causes import CAUSES
from pitstop.plan.from_run import setup_for_run
from pitstop.plan.memory import GIB
from pitstop.plan.planner import largest_micro_batch


def finding(p, cause):  # type: ignore[no-untyped-def]
    found = [f for f in diagnose(p).findings if f.cause == cause]
    return found[0] if found else None


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_well_tuned_run_has_no_high_finding(device: str) -> None:
    d = diagnose(well_tuned(device))
    assert not [f for f in d.findings if f.severity == "high"], [f.cause for f in d.findings]


def test_cpu_run_skips_and_lists_gpu_checks() -> None:
    d = diagnose(well_tuned("cpu"))
    assert set(d.skipped_checks) == {c.id for c in CAUSES.values() if c.needs_gpu}
    assert diagnose(well_tuned("cuda")).skipped_checks == []


def test_gpu_only_rules_never_fire_on_cpu() -> None:
    # everything a GPU rule could want: fp32, pageable memory, syncs, offload; but the run is on the CPU
    p = profile(
        "cpu",
        steps(syncs=5, sync_s=0.01),
        param_dtype="fp32",
        offload={"optimizer": "cpu"},
        dataloader=DataLoaderInfo(num_workers=4, pin_memory=False, batch_size=8),
    )
    gpu_only = {c.id for c in CAUSES.values() if c.needs_gpu}
    assert not gpu_only & {f.cause for f in diagnose(p).findings}


def test_dataloader_bound_from_measured_wait() -> None:
    dl = DataLoaderInfo(
        num_workers=0, pin_memory=False, batch_size=8, examples_are_text=True, collate_s_per_batch=0.03
    )
    f = finding(profile("cuda", steps(wall=0.1, data=0.04), util=55.0, dataloader=dl), "dataloader_bound")
    assert f is not None and f.severity == "high"
    assert f.evidence["data_wait_frac"] == pytest.approx(0.4)
    assert f.est_speedup == pytest.approx(1 / 0.6)
    assert "tokenized inside the collate" in f.summary and "num_workers=0" in f.summary
    assert "dataloader_num_workers" in (f.fix.snippet or "")  # the HF Trainer snippet, framework hf_trainer
    assert f.fix.snippets["pytorch"].count("num_workers=") == 1


@pytest.mark.parametrize(
    ("cores", "have", "expected"),
    [
        (2, 0, 1 / 0.65),  # one worker (a core kept for the step) loads a batch in the whole 65 ms wait
        (8, 0, 1 / 0.35),  # seven: a batch every 9 ms, hidden behind the 35 ms rest of the step
        (16, 2, 1 / 0.35),  # two bound the step now (a batch each per 2 steps); seven more hide it
        (2, 1, 1 / 0.35),  # no more workers than now: hiding the wait is only the bound
    ],
)
def test_dataloader_estimate_follows_the_workers_the_fix_adds(cores: int, have: int, expected: float) -> None:
    """The calibration's loader-6ms job on 2 cores: 65% data wait, the fix's one worker measured x1.52, where
    hiding the whole wait (x2.86) was estimated before."""
    dl = DataLoaderInfo(num_workers=have, pin_memory=False, batch_size=8)
    p = profile("cpu", steps(wall=0.1, data=0.065), dataloader=dl, cpu_count=cores)
    f = finding(p, "dataloader_bound")
    assert f is not None and f.est_speedup == pytest.approx(expected, rel=1e-3)
    if cores == 2 and have == 0:
        assert "num_workers=1 each worker loads a batch in the 65 ms" in f.speedup_basis


def test_dataloader_quiet_below_threshold() -> None:
    assert finding(profile("cpu", steps(wall=0.1, data=0.003)), "dataloader_bound") is None


def test_padding_waste_estimate_uses_compute_share() -> None:
    p = profile("cpu", steps(wall=0.1, data=0.0, real_frac=0.4))
    f = finding(p, "padding_waste")
    assert f is not None and f.severity == "high"
    assert f.evidence["padding_frac"] == pytest.approx(0.6)
    assert f.evidence["fixed_row_length"] is True
    # forward + backward (95% of the step; the optimizer's 5% does not scale with tokens): 1 / (1 - 0.95 * 0.6)
    assert f.est_speedup == pytest.approx(1 / (1 - 0.95 * 0.6), rel=1e-3)


def test_padding_quiet_when_packed() -> None:
    assert finding(profile("cpu", steps(real_frac=0.97)), "padding_waste") is None


def test_slow_attention_eager_with_flops_basis() -> None:
    p = profile(
        "cuda",
        steps(row_len=2048),
        util=95.0,
        attention=AttentionInfo(implementation="eager", sdpa_calls=0, sdpa_calls_with_mask=0),
    )
    f = finding(p, "slow_attention")
    assert f is not None and f.confidence >= 0.9
    assert f.severity == "high"  # 2k-token rows
    assert 0 < f.evidence["attention_flops_frac"] < 0.5
    assert f.est_speedup and f.est_speedup > 1.0
    assert "flash_attention_2" in f.fix.snippets["hf_trainer"]


def test_slow_attention_quiet_for_sdpa() -> None:
    assert finding(profile("cuda", util=95.0), "slow_attention") is None


def test_no_mixed_precision_fp32_on_tensor_core_gpu() -> None:
    p = profile("cuda", util=95.0, param_dtype="fp32", autocast_dtype=None, tf32=False)
    f = finding(p, "no_mixed_precision")
    assert f is not None and f.severity == "high"
    assert f.evidence["peak_ratio"] > 10  # H100: bf16 989 vs fp32 67 TFLOP/s
    assert "bf16=True" in f.fix.snippets["hf_trainer"]


def test_tf32_only_is_medium_and_bf16_autocast_is_fine() -> None:
    tf32 = finding(profile("cuda", util=95.0, param_dtype="fp32", tf32=True), "no_mixed_precision")
    assert tf32 is not None and tf32.severity == "medium"
    assert (
        finding(profile("cuda", util=95.0, param_dtype="fp32", autocast_dtype="bf16"), "no_mixed_precision")
        is None
    )


def test_fp16_advised_where_there_is_no_bf16() -> None:
    f = finding(
        profile("cuda", util=95.0, param_dtype="fp32", tf32=False, gpu_name="Tesla T4"), "no_mixed_precision"
    )
    assert f is not None and "fp16=True" in f.fix.snippets["hf_trainer"]


def test_small_batch_from_low_utilization_with_headroom() -> None:
    f = finding(
        profile(
            "cuda",
            steps(rows=1, row_len=512),
            util=35.0,
            mem_frac=0.2,
            micro_batch_size=1,
            grad_accum_steps=8,
        ),
        "small_batch",
    )
    assert f is not None and f.severity == "high"
    assert f.evidence["gpu_util"] == pytest.approx(0.35)
    assert "per_device_train_batch_size=2" in f.fix.snippets["hf_trainer"]
    assert "gradient_accumulation_steps=4" in f.fix.snippets["hf_trainer"]


def test_small_batch_quiet_when_memory_is_full_or_data_explains_idle() -> None:
    assert finding(profile("cuda", util=35.0, mem_frac=0.95), "small_batch") is None
    assert (
        finding(profile("cuda", steps(wall=0.1, data=0.05), util=35.0, mem_frac=0.2), "small_batch") is None
    )


def idle_llama_1b(row_len: int, micro_batch: int, accumulation: int) -> RunProfile:
    """A GPU busy 35% of the time, training Llama-3.2-1B (its full shape, so the planner can size it)."""
    return profile(
        "cuda",
        steps(rows=1, row_len=row_len),
        util=35.0,
        mem_frac=0.2,
        micro_batch_size=micro_batch,
        grad_accum_steps=accumulation,
        model=replace(LLAMA_1B, intermediate_size=8192, n_kv_heads=8),
    )


def test_small_batch_suggests_the_planners_largest_micro_batch() -> None:
    p = idle_llama_1b(512, micro_batch=1, accumulation=8)
    f = finding(p, "small_batch")
    planned = largest_micro_batch(setup_for_run(p.ranks[0].environment, seq=512), 80 * GIB)  # type: ignore[arg-type]
    assert f is not None and f.evidence["plan_max_micro_batch"] == planned >= 8
    # the largest size that fits and keeps the effective batch of 8
    assert "per_device_train_batch_size=8" in f.fix.snippets["hf_trainer"]
    assert "gradient_accumulation_steps=1" in f.fix.snippets["hf_trainer"]
    assert f"predicts up to {planned} fits" in f.fix.text


def test_small_batch_quiet_when_the_planner_says_no_bigger_batch_fits() -> None:
    assert finding(idle_llama_1b(4096, micro_batch=64, accumulation=1), "small_batch") is None


def test_offload_that_is_not_needed_is_high() -> None:
    p = profile("cuda", steps(wall=0.5, opt=0.2), util=60.0, offload={"optimizer": "cpu"}, zero_stage=2)
    f = finding(p, "offload_bound")
    assert f is not None and f.severity == "high"
    assert f.evidence["model_states_gib_per_gpu"] < 0.6 * 80
    assert f.est_speedup and f.est_speedup > 1.5  # the 0.2 s host optimizer step goes away
    assert '"device": "none"' in f.fix.snippets["deepspeed"]


def test_offload_needed_for_fit_is_medium_without_estimate() -> None:
    big = profile("cuda", util=60.0, offload={"optimizer": "cpu", "param": "cpu"}, zero_stage=3)
    big.ranks[0].environment.model.params_total = 70_000_000_000
    big.ranks[0].environment.model.params_trainable = 70_000_000_000
    f = finding(big, "offload_bound")
    assert f is not None and f.severity == "medium" and f.est_speedup is None


def test_host_sync_needs_gpu_idle() -> None:
    f = finding(profile("cuda", steps(syncs=4, sync_s=0.01), util=70.0), "host_sync")
    assert f is not None and f.evidence["syncs_per_step"] == 4
    assert finding(profile("cuda", steps(syncs=4, sync_s=0.01), util=99.0), "host_sync") is None


def test_pageable_copies_is_small_for_token_batches() -> None:
    f = finding(
        profile("cuda", util=95.0, dataloader=DataLoaderInfo(num_workers=4, pin_memory=False, batch_size=8)),
        "pageable_copies",
    )
    assert f is not None and f.severity == "low"  # 200 KB of token ids per step is cheap even pageable
    assert f.est_speedup is not None and f.est_speedup < 1.01


def test_straggler_names_the_slow_rank() -> None:
    p = profile("cuda", util=90.0, ranks=4)
    p.ranks[2].steps = steps(wall=0.1, data=0.03)
    f = finding(p, "straggler")
    assert f is not None and f.evidence["slow_rank"] == 2
    assert f.evidence["data_wait_frac_per_rank"]["2"] == pytest.approx(0.3)
    assert "waits on its input pipeline" in f.summary
    dl = finding(p, "dataloader_bound")  # paced by the slowest rank, not the mean of four
    assert dl is not None and dl.evidence["data_wait_frac"] == pytest.approx(0.3)


def test_straggler_quiet_for_balanced_ranks() -> None:
    assert finding(profile("cuda", util=90.0, ranks=4), "straggler") is None


def test_low_mfu_only_when_busy_and_unexplained() -> None:
    slow = profile("cuda", steps(wall=1.5), util=96.0)  # ~4% MFU for a 1B model on an H100
    f = finding(slow, "low_mfu_unexplained")
    assert f is not None and f.evidence["mfu"] < 0.1
    explained = profile("cuda", steps(wall=1.5), util=96.0, param_dtype="fp32", tf32=False)
    assert finding(explained, "low_mfu_unexplained") is None  # no_mixed_precision (high) explains it


def test_findings_ranked_by_time_saved() -> None:
    dl = DataLoaderInfo(num_workers=0, pin_memory=True, batch_size=8)
    p = profile("cpu", steps(wall=0.1, data=0.02, real_frac=0.3), dataloader=dl)
    d = diagnose(p)
    saved = [f.time_saved_frac for f in d.findings]
    assert saved == sorted(saved, reverse=True)
    assert [f.cause for f in d.findings][:2] == ["padding_waste", "dataloader_bound"]


def test_json_document_has_the_stable_fields() -> None:
    doc = diagnose(profile("cuda", steps(wall=0.1, data=0.04), util=50.0)).to_dict()
    assert doc["schema"] == "pitstop.run/1"
    for key in ("cause", "severity", "confidence", "est_speedup", "evidence", "summary", "fix"):
        assert key in doc["findings"][0]
    for key in (
        "steps_measured",
        "step_time_s",
        "tokens_per_s",
        "real_tokens_per_s",
        "data_wait_frac",
        "padding_frac",
        "gpu_util",
        "mfu",
    ):
        assert key in doc["metrics"]
    for key in (
        "device",
        "attn_implementation",
        "param_dtype",
        "autocast_dtype",
        "tf32",
        "dataloader",
        "offload",
        "world_size",
    ):
        assert key in doc["environment"]
    assert doc["environment"]["dataloader"]["num_workers"] == 4
    assert len(doc["ranks"]) == 1


def test_gpu_samples_outside_the_window_are_ignored() -> None:
    p = profile("cuda", util=90.0)
    rank = p.ranks[0]
    rank.gpu_samples = gpu_samples(10.0)[:5] + gpu_samples(90.0)
    for i, s in enumerate(rank.gpu_samples):
        s.t = float(i)
    rank.window_start_t, rank.window_end_t = 5.0, 100.0
    assert diagnose(p).metrics.gpu_util == pytest.approx(0.9)


def test_where_counts_and_steps_came_from_is_one_line() -> None:
    from pitstop.core.profile import CountSource, StepBoundary
    from pitstop.diagnose import counting_line

    p = profile("cpu", steps())
    assert counting_line(p) is None  # a source that does not say (offline inputs, older profiles)
    rank = p.ranks[0]
    rank.tokens_counted_from, rank.steps_delimited_by = CountSource.DATALOADER, StepBoundary.OPTIMIZER_STEP
    assert counting_line(p) == "counted from DataLoader batches · steps: optimizer step"
    rank.tokens_counted_from, rank.steps_delimited_by = CountSource.MODEL_INPUTS, StepBoundary.MODEL_FORWARD
    rank.step_boundary_reason = "the optimizer steps inside backward (per-parameter gradient hooks)"
    line = diagnose(p).environment_table()["counted"]
    assert line.startswith("counted from the model's forward inputs")
    assert line.endswith(
        "· steps: next forward (the optimizer steps inside backward (per-parameter gradient hooks))"
    )
    rank.tokens_counted_from = CountSource.UNKNOWN
    assert "counted from nothing (neither the DataLoader's batches" in (counting_line(p) or "")
    assert not [n for n in diagnose(p).notes if "model's" in n]  # the line replaces the notes


def test_the_step_line_states_what_one_step_holds_on_every_rank() -> None:
    """Issue 40's misread workload: an it/s that fell because each step grew (accumulation, more ranks)
    reads as a bigger step, not a slower job."""
    from dataclasses import replace as with_

    from pitstop.diagnose import step_line

    accumulated = [
        with_(s, micro_batches=4, samples=32, tokens=32 * 1024, real_tokens=32 * 1024)
        for s in steps(wall=0.5)
    ]
    p = profile("cpu", accumulated, ranks=2)
    d = diagnose(p)
    assert d.metrics.micro_batches_per_step == 4
    assert d.metrics.samples_per_step == 64 and d.metrics.tokens_per_step == 64 * 1024
    line = step_line(p, d.metrics)
    assert (
        line
        == "1 step = 4 micro-batches × 8 samples on each of 2 ranks = 64 samples, 65,536 tokens · 2 steps/s"
    )
    assert d.environment_table()["step"] == line
    p.environment.world_size = 8  # two of eight ranks measured: the figures say whose they are
    assert (step_line(p, diagnose(p).metrics) or "").endswith(
        "65,536 tokens on the 2 ranks measured · 2 steps/s"
    )
    p.source = "analyze"  # offline sources have no per-step counts of their own
    assert step_line(p, diagnose(p).metrics) is None
