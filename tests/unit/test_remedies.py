"""Remedies: each defined once, and every place that shows one (a Finding's fix, tune's kept change) shows
the same advice."""

from __future__ import annotations

import dataclasses

import pytest
from tests.factories import environment, profile, steps

from pitstop.core.profile import DataLoaderInfo
from pitstop.core.vocabulary import Framework
from pitstop.diagnose import diagnose
from pitstop.diagnose.causes import CAUSES
from pitstop.remedies import REGISTRY, RemedyId, advise, remedy, use
from pitstop.tune.proposals import kept_change, tunable


@pytest.mark.parametrize("rid", list(REGISTRY))
def test_every_remedy_advises_every_framework_without_parameters(rid: RemedyId) -> None:
    for fw in Framework:
        advice = remedy(rid).advice(fw, {})
        assert advice.text.strip() and advice.snippet.strip()
        assert "None" not in advice.text, f"{rid}/{fw}: an unknown parameter printed as None"


def test_registry_is_consistent_with_the_causes() -> None:
    for rid, r in REGISTRY.items():
        assert set(r.exclusive_with) <= set(REGISTRY) and set(r.helps_with) <= set(REGISTRY)
        assert r.tunable or r.loader_order is None
        assert r.tunable == (r.tune_rank is not None), (
            f"{rid}: a tunable remedy has its place in tune's order"
        )
    for cause in CAUSES.values():
        assert cause.remedies and set(cause.remedies) <= set(REGISTRY), f"{cause.id} has no registered remedy"
    answered = {rid for cause in CAUSES.values() for rid in cause.remedies}
    assert answered == set(REGISTRY), f"remedies no cause names: {set(REGISTRY) - answered}"


def test_a_findings_fix_and_tunes_kept_change_are_one_text() -> None:
    # eager attention, padded text batches, no workers: three findings whose remedies tune can try
    eager = profile(
        "cpu",
        steps(data=0.03, real_frac=0.5),
        framework="hf_trainer",
        attention=dataclasses.replace(environment().attention, implementation="eager", sdpa_calls=0),
        dataloader=DataLoaderInfo(num_workers=0, batch_size=8, examples_are_text=True),
    )
    findings = diagnose(eager).findings
    seen = 0
    for finding in findings:
        for u in finding.fix.uses:
            if u.remedy in tunable():
                change = kept_change(u.remedy, "hf_trainer", u.params)
                assert change.text in finding.fix.text
                assert change.snippet in (finding.fix.snippet or "")
                seen += 1
    assert seen >= 3
    doc = findings[0].to_dict()
    assert doc["fix"]["remedies"] and doc["fix"]["remedies"][0]["id"] in {str(r) for r in REGISTRY}


def test_worker_count_comes_from_the_jobs_own_cores_or_is_not_invented() -> None:
    here = advise(
        "pytorch", use(RemedyId.WORKERS, workers=7, basis="16 cores over 2 ranks, one kept for each")
    )
    assert "num_workers=7" in (here.snippet or "") and "16 cores over 2 ranks" in here.text
    elsewhere = profile("cpu", steps(data=0.04), cpu_count=None, framework="pytorch")
    fix = next(f for f in diagnose(elsewhere).findings if f.cause == "dataloader_bound").fix
    assert "num_workers=N" in (fix.snippet or "") and "nproc" in fix.text


def test_micro_batch_fix_names_no_number_it_does_not_know() -> None:
    unknown = advise("hf_trainer", use(RemedyId.MICRO_BATCH)).text
    assert "1 → 2" not in unknown and "unknown" in unknown and "pitstop plan" in unknown
    known = advise(
        "hf_trainer", use(RemedyId.MICRO_BATCH, micro=2, accum=4, new_micro=8, new_accum=1, basis="x")
    )
    assert "from 2 to 8" in known.text and "per_device_train_batch_size=8" in (known.snippet or "")


def test_needless_recompute_is_one_rule_and_one_remedy() -> None:
    on_cpu = profile("cpu", steps(fwd=0.03, bwd=0.09), gradient_checkpointing=True)
    finding = next(f for f in diagnose(on_cpu).findings if f.cause == "needless_recompute")
    assert finding.fix.uses[0].remedy is RemedyId.NO_CHECKPOINTING
    assert finding.evidence["forward_frac"] == pytest.approx(0.3, abs=0.01)
    assert finding.est_speedup == pytest.approx(1 / 0.7, rel=0.05)
    off = profile("cpu", steps(fwd=0.03, bwd=0.06), gradient_checkpointing=False)
    assert "needless_recompute" not in {f.cause for f in diagnose(off).findings}
    # a GPU whose memory is nearly full with checkpointing on: nothing says it would fit without it
    full = profile("cuda", steps(fwd=0.03, bwd=0.09), util=95.0, mem_frac=0.9, gradient_checkpointing=True)
    full.environment.model = dataclasses.replace(full.environment.model, params_total=None)
    assert "needless_recompute" not in {f.cause for f in diagnose(full).findings}


def test_precision_offers_what_the_gpu_has() -> None:
    from pitstop.remedies import TrialFacts

    v100 = TrialFacts(
        on_gpu=True,
        hf_model=True,
        framework=Framework.HF_TRAINER,
        examples_are_text=False,
        gpu_has_bf16=False,
        gpu_has_tf32=False,
    )
    assert remedy(RemedyId.BF16).cannot_try(v100) and remedy(RemedyId.TF32).cannot_try(v100)
    assert remedy(RemedyId.FP16).cannot_try(v100) is None
    h100 = dataclasses.replace(v100, gpu_has_bf16=True, gpu_has_tf32=True)
    assert remedy(RemedyId.BF16).cannot_try(h100) is None and remedy(RemedyId.FP16).cannot_try(h100)
    plain_loop = dataclasses.replace(v100, framework=Framework.PYTORCH)
    assert "loss scaler" in (remedy(RemedyId.FP16).cannot_try(plain_loop) or "")


def test_a_transformers_model_in_a_plain_loop_is_told_to_load_with_sdpa() -> None:
    env = environment()
    p = profile(
        "cpu",
        steps(),
        framework="pytorch",
        model=dataclasses.replace(env.model, library="transformers", model_type=None),
        attention=dataclasses.replace(env.attention, implementation="eager", sdpa_calls=0),
    )
    fix = next(f for f in diagnose(p).findings if f.cause == "slow_attention").fix
    assert 'attn_implementation="sdpa"' in (fix.snippet or "")
    assert "scaled_dot_product_attention" not in (fix.snippet or "")


def test_pinned_but_blocking_copies_overlap_nothing() -> None:
    env = environment("cuda")
    loader = dataclasses.replace(
        env.dataloader,
        pin_memory=True,
        h2d_copies=40,
        h2d_copies_pinned_blocking=40,
        h2d_copies_non_blocking=0,
    )
    records = steps(wall=0.05)
    for r in records:
        r.h2d_bytes = 400 * 2**20
    p = profile("cuda", records, util=60.0, dataloader=loader)
    finding = next(f for f in diagnose(p).findings if f.cause == "pageable_copies")
    assert finding.evidence["h2d_copies_pinned_blocking"] == 40
    assert "non_blocking=False" in finding.summary and "non_blocking=True" in finding.fix.text
