"""per_step_cleanup: the rule on hand-made profiles (the calls the probe counted and timed), how it splits the
collector's time with gc_pauses and the allocator's churn with allocator_thrash, the offline setting, its
remedy's advice; and the collector's wrappers in this process (every call handed on unchanged, attributed to
the line that made it)."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.factories import profile, steps

from pitstop.core.findings import Finding
from pitstop.core.profile import GcGeneration, GcPauses, JobCall, MemoryStats, RunProfile
from pitstop.core.vocabulary import Framework, RemedyId, Severity, Source
from pitstop.diagnose import diagnose
from pitstop.diagnose.causes import allocator_thrash, gc_pauses, per_step_cleanup
from pitstop.remedies import advise, remedy, use

SITE = "/home/me/train.py:88 in main"


def finding(p: RunProfile, cause: str = "per_step_cleanup") -> Finding | None:
    return next((f for f in diagnose(p).findings if f.cause == cause), None)


def collect(count: int = 20, seconds: float = 1.0, steps_in: int = 20, collected: int = 0) -> JobCall:
    return JobCall("gc.collect", SITE, count=count, steps=steps_in, seconds=seconds, collected=collected)


def flush(
    count: int = 20,
    seconds: float = 0.001,
    site: str = SITE,
    via: str | None = None,
    setting: str | None = None,
) -> JobCall:
    return JobCall(
        "torch.cuda.empty_cache", site, count=count, steps=count, seconds=seconds, via=via, setting=setting
    )


def cpu(*calls: JobCall, gc_state: GcPauses | None = None) -> RunProfile:
    p = profile("cpu", steps(n=20, wall=0.1), framework="pytorch")  # 2 s measured
    p.ranks[0].job_calls = list(calls)
    p.ranks[0].gc_pauses = gc_state
    return p


def test_a_collection_every_step_is_named_with_its_line_and_its_share() -> None:
    p = cpu(collect(seconds=1.0))  # 50 ms of each 100 ms step, finding no garbage
    f = finding(p)
    assert f is not None and f.severity is Severity.HIGH and f.confidence == pytest.approx(0.9)
    assert f.est_speedup == pytest.approx(2.0)  # the calls' half of the step taken out
    ev = f.evidence
    assert ev["share"] == pytest.approx(0.5) and ev["steps"] == 20 and ev["rank"] == 0
    (call,) = ev["calls"]
    assert call["call"] == "gc.collect" and call["site"] == SITE and call["steps"] == 20
    assert call["ms_per_call"] == pytest.approx(50.0)
    assert "gc.collect() in 20 of 20 measured steps, at /home/me/train.py:88 in main" in f.summary
    assert f.fix.uses[0].remedy is RemedyId.NO_PER_STEP_CLEANUP and SITE in f.fix.text
    assert "gc.collect()" in (f.fix.snippet or "") and "% 200 == 0" in (f.fix.snippet or "")


def test_what_the_collections_found_stays_with_the_automatic_collector() -> None:
    """Each call found 100 k garbage objects beside 300 k survivors: finding them (3× a survivor each) is
    paid with or without the calls; traversing the survivors is what goes."""
    state = GcPauses(enabled=True, tracked=300_000, frozen=0)
    p = cpu(collect(seconds=1.0, collected=20 * 100_000), gc_state=state)
    f = finding(p)
    part = 300_000 / (300_000 + 3 * 100_000)
    assert f is not None and f.est_speedup == pytest.approx(1 / (1 - 0.5 * part))
    assert "300,000 tracked objects" in f.speedup_basis and "100,000 garbage objects" in f.speedup_basis
    state.tracked = None  # not counted: the whole time, an upper bound
    f = finding(p)
    assert f is not None and f.est_speedup == pytest.approx(2.0) and "upper bound" in f.speedup_basis


def test_an_empty_cache_on_a_cpu_costs_nothing_and_a_rare_or_cheap_call_is_no_finding() -> None:
    assert finding(cpu(flush())) is None  # torch.cuda.empty_cache() on a CPU: a no-op
    assert finding(cpu(collect(count=1, steps_in=1, seconds=0.5))) is None  # once in the window
    assert finding(cpu(collect(seconds=0.04))) is None  # 2% of the step
    assert finding(cpu(collect(count=4, steps_in=4, seconds=0.1))) is None  # every 5 steps, 5%
    f = finding(cpu(collect(count=4, steps_in=4, seconds=0.6)))  # every 5 steps, 30%: it matters
    assert f is not None and f.evidence["share"] == pytest.approx(0.3)
    assert finding(profile("cpu", steps(n=20))) is None  # not watched (a trace): nothing to say


def test_empty_cache_on_a_gpu_counts_the_allocator_growing_back_capped_by_the_idle_share() -> None:
    p = profile("cuda", steps(n=20, wall=0.1), util=90.0, framework="pytorch")
    rank = p.ranks[0]
    rank.job_calls = [flush(seconds=0.2)]  # 10 ms a call: cudaFree, waiting for the GPU
    rank.memory = MemoryStats(
        window_steps=20, window_device_allocs=200, window_device_frees=200, steps_with_device_allocs=20
    )
    f = finding(p)
    assert f is not None
    assert f.evidence["calls"][0]["share"] == pytest.approx((0.2 + 200 * 1e-3) / 2.0)
    assert f.evidence["cuda_mallocs"] == 200 and f.evidence["share"] == pytest.approx(0.1)
    assert "200 cudaMalloc calls" in f.speedup_basis and "idle share (10%)" in f.speedup_basis
    assert "It takes 20% of the measured step time" in f.summary  # 10% in the calls, 10% growing back
    assert f.est_speedup == pytest.approx(1 / (1 - 0.1))  # the GPU idles 10%: no more than that is lost
    # the same churn is not also the allocator thrashing (whose fix, expandable segments, would not help)
    assert finding(p, "allocator_thrash") is None
    rank.job_calls = []  # churn with no emptying call: allocator_thrash's again
    assert finding(p, "allocator_thrash") is not None and finding(p) is None


def test_the_trainers_setting_is_named_with_the_library_line_and_the_fix_drops_it() -> None:
    p = profile("cuda", steps(n=20, wall=0.1), framework="hf_trainer")
    via = "accelerate/utils/memory.py:41 in clear_device_cache"
    setting = "TrainingArguments(torch_empty_cache_steps=1)"
    p.ranks[0].job_calls = [
        flush(seconds=0.4, site="/home/me/train.py:120 in main", via=via, setting=setting)
    ]
    f = finding(p)
    assert f is not None and f.evidence["calls"][0]["setting"] == setting
    assert f"by {via} ({setting}), under /home/me/train.py:120 in main" in f.summary
    assert "Drop torch_empty_cache_steps" in f.fix.text and setting in f.fix.text
    assert "torch_empty_cache_steps=None" in (f.fix.snippet or "")


def test_a_call_one_rank_makes_alone_keeps_the_others_waiting() -> None:
    p = profile("cpu", steps(n=20, wall=0.1), ranks=2, framework="pytorch")
    p.ranks[0].job_calls = []
    p.ranks[1].job_calls = [collect(seconds=0.8)]
    f = finding(p)
    assert f is not None and f.evidence["rank"] == 1 and f.evidence["ranks_calling"] == [1]
    assert "Only rank 1 makes these calls: the other ranks wait for them at the next collective." in f.summary
    p.ranks[0].job_calls = [collect(seconds=0.8)]
    f = finding(p)
    assert f is not None and "Only rank" not in f.summary and f.evidence["ranks_calling"] == [0, 1]


def test_the_jobs_own_collections_are_not_the_collectors_pauses() -> None:
    """The probe tells explicit collections apart: gc_pauses reads the automatic ones only, so it does not
    advise collecting by hand to a job that already does, every step; per_step_cleanup answers for them."""
    by_hand = GcGeneration(collections=20, pause_s=1.0, longest_s=0.06, collected=0, steps=20)
    young = GcGeneration(collections=40, pause_s=0.02, longest_s=0.001, collected=100, steps=20)
    state = GcPauses(
        generations=[young, GcGeneration(), by_hand],
        automatic=[young, GcGeneration(), GcGeneration()],
        enabled=True,
        frozen=0,
        tracked=900_000,
    )
    p = cpu(collect(seconds=1.0), gc_state=state)
    assert finding(p, "gc_pauses") is None and finding(p) is not None
    state.automatic = None  # an older profile: every collection is the collector's, as before
    f = finding(p, "gc_pauses")
    assert f is not None and f.evidence["by_hand_ms"] == 0.0
    # automatic full collections beside the job's own: gc_pauses counts only the former
    state.generations[2] = GcGeneration(collections=22, pause_s=1.3, longest_s=0.2, steps=20)
    state.automatic = [
        young,
        GcGeneration(),
        GcGeneration(collections=2, pause_s=0.3, longest_s=0.2, steps=2),
    ]
    f = finding(p, "gc_pauses")
    assert f is not None and f.evidence["gen2_frac"] == pytest.approx(0.15)
    assert f.evidence["by_hand_ms"] == pytest.approx(1000.0) and f.evidence["steps_with_gen2"] == 2


def test_from_a_configuration_the_setting_is_named_with_lower_confidence() -> None:
    said = "args.json: torch_empty_cache_steps=1: the device cache is emptied every 1 steps"
    p = profile("cuda", [], framework="hf_trainer", empty_cache_steps=1)  # check / analyze: no steps
    p.ranks[0].environment.configured_by = {"empty_cache_steps": said}
    f = finding(p)
    assert f is not None and f.confidence == pytest.approx(0.5)
    assert f.evidence == {
        "setting": "TrainingArguments(torch_empty_cache_steps=1)",
        "empty_cache_steps": 1,
        "source": "configuration",
        "configured_by": said,
    }
    assert f.est_speedup == pytest.approx(1 / 0.9) and "31372" in f.speedup_basis
    assert "torch_empty_cache_steps=None" in (f.fix.snippet or "")
    assert finding(profile("cuda", [], empty_cache_steps=100)) is None  # every 100 steps: 0.1%
    assert finding(profile("cpu", [], empty_cache_steps=1)) is None  # a CPU run empties no cache
    live = profile("cuda", steps(n=20), empty_cache_steps=1)
    live.ranks[0].job_calls = []  # watched, and no call seen: the setting did not cost here
    assert finding(live) is None


def test_calls_read_from_sampled_stacks_are_named_with_less_confidence() -> None:
    """pitstop attach fills the calls from py-spy's samples: no collector counted what they found."""
    p = cpu(collect(seconds=1.0))
    p.source = Source.ATTACH
    f = finding(p)
    assert f is not None and f.confidence == pytest.approx(0.7) and f.est_speedup == pytest.approx(2.0)
    assert "not in sampled stacks" in f.speedup_basis


def test_with_automatic_collection_off_the_calls_are_thinned_not_removed() -> None:
    """gc.disable() and a gc.collect() every step: the calls are the job's only collector, so the fix keeps one
    in ten; a collection every few steps is already that schedule (manual_gc's advice), not a finding."""
    state = GcPauses(enabled=False, tracked=300_000, frozen=0)
    f = finding(cpu(collect(seconds=1.0), gc_state=state))
    assert f is not None and f.est_speedup == pytest.approx(1 / (1 - 0.5 * 0.9))
    assert "one call in 10 kept" in f.speedup_basis and "every 10 steps instead of every step" in f.fix.text
    assert "% 10 == 0" in (f.fix.snippet or "") and "gc.freeze() after setup" in f.fix.text
    assert finding(cpu(collect(count=4, steps_in=4, seconds=0.8), gc_state=state)) is None


def test_the_shared_figures_are_the_other_modules_own() -> None:
    """The rule restates figures as literals (the causes page prints a module's own constants)."""
    from pitstop.remedies import no_per_step_cleanup

    assert per_step_cleanup.FOUND_COST == gc_pauses.FOUND_COST
    assert per_step_cleanup.ASSUMED_DRIVER_CALL_S == allocator_thrash.ASSUMED_DRIVER_CALL_S
    assert per_step_cleanup.KEPT_WITHOUT_AUTOMATIC == no_per_step_cleanup.EVERY_WITHOUT_AUTOMATIC


@pytest.mark.parametrize("fw", list(Framework))
def test_the_advice_names_the_line_and_a_rare_schedule_in_every_framework(fw: Framework) -> None:
    calls = [{"call": "gc.collect", "site": SITE, "via": None, "setting": None}]
    advice = remedy(RemedyId.NO_PER_STEP_CLEANUP).advice(fw, {"calls": calls, "gc_enabled": True})
    assert SITE in advice.text and "gc.collect()" in advice.snippet and "200" in advice.snippet
    assert "torch.cuda.empty_cache" not in advice.snippet and "None" not in advice.text
    off = advise(fw, use(RemedyId.NO_PER_STEP_CLEANUP, calls=calls, gc_enabled=False)).text
    assert "only collector" in off and "gc.freeze() after setup" in off and "Take gc.collect() out" not in off
    setting = [{"call": "torch.cuda.empty_cache", "setting": "TrainingArguments(torch_empty_cache_steps=1)"}]
    dropped = remedy(RemedyId.NO_PER_STEP_CLEANUP).advice(fw, {"calls": setting})
    assert "Drop torch_empty_cache_steps" in dropped.text
    assert ("torch_empty_cache_steps=None" in dropped.snippet) == fw.is_trainer
    assert remedy(RemedyId.NO_PER_STEP_CLEANUP).tunable
    assert remedy(RemedyId.NO_PER_STEP_CLEANUP).preserves_computation


# -- the collector, in this process -----------------------------------------------------------------------


@pytest.fixture
def calls() -> Iterator[object]:
    """The job-calls collector installed on this process and counting, as in a window at step 3."""
    torch = pytest.importorskip("torch")
    from pitstop.probe.collectors.job_calls import JobCallsCollector
    from pitstop.probe.config import ProbeConfig
    from pitstop.probe.probe import Probe

    original_collect, original_flush = gc.collect, torch.cuda.empty_cache
    probe = Probe(ProbeConfig(announce=False))
    probe.hooks.active = True
    probe.ctx.step_index = lambda: 3
    collector = next(c for c in probe.collectors if isinstance(c, JobCallsCollector))
    collector.install()
    collector.start_window()
    try:
        yield collector
    finally:
        probe.hooks.remove()
        assert gc.collect is original_collect and torch.cuda.empty_cache is original_flush


def test_every_call_is_handed_on_unchanged_and_attributed_to_this_line(calls: object) -> None:
    from pitstop.core.profile import RankProfile
    from pitstop.probe.collectors.job_calls import collecting_by_hand

    seen: list[bool] = []

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            seen.append(collecting_by_hand())

    garbage: list[object] = []
    garbage.append(garbage)
    del garbage
    gc.callbacks.append(watch)
    try:
        line = sys._getframe().f_lineno + 1
        found = (gc.collect(generation=2), gc.collect(0))  # its arguments reach it, its results come back
        with pytest.raises(ValueError):
            gc.collect(7)  # and so do its errors
    finally:
        gc.callbacks.remove(watch)
    assert found[0] >= 1 and found[1] == 0 and seen == [True, True] and not collecting_by_hand()
    draft = RankProfile()
    calls.fill(draft)  # type: ignore[attr-defined]
    assert draft.job_calls is not None
    (made,) = [c for c in draft.job_calls if c.call == "gc.collect"]
    assert (
        made.site
        == f"{__file__}:{line} in test_every_call_is_handed_on_unchanged_and_attributed_to_this_line"
    )
    assert (made.count, made.steps, made.via, made.setting) == (2, 1, None, None)
    assert made.collected >= 1 and made.seconds > 0  # the first found the cycle


def test_a_call_a_library_makes_names_the_library_and_the_jobs_line(calls: object) -> None:
    """accelerate's ``release_memory`` (what ``accelerator.free_memory()`` runs) collects: the call is charged to
    the job's line that asked for it, with accelerate's own line as ``via``."""
    memory = pytest.importorskip("accelerate.utils.memory")
    from pitstop.core.profile import RankProfile

    line = sys._getframe().f_lineno + 1
    memory.release_memory()
    draft = RankProfile()
    calls.fill(draft)  # type: ignore[attr-defined]
    assert draft.job_calls is not None
    made = next(c for c in draft.job_calls if c.call == "gc.collect")
    assert made.site.startswith(f"{__file__}:{line} in ")
    assert made.via is not None and made.via.startswith("accelerate/utils/memory.py:")
    assert "in clear_device_cache" in made.via and made.setting is None


def test_torchs_own_collection_after_a_compile_is_not_the_jobs(calls: object) -> None:
    """dynamo runs ``gc.collect(1)`` after each compile (``run_gc_after_compile``): a frame of torch's that
    calls it is torch's own, not a cleanup in the job's loop (a recompiling job would look like one)."""
    import torch

    from pitstop.core.profile import RankProfile

    in_torch = str(Path(torch.__file__).parent / "_dynamo" / "convert_frame.py")
    exec(compile("import gc\ngc.collect(1)", in_torch, "exec"), {})  # a frame whose file is torch's
    draft = RankProfile()
    calls.fill(draft)  # type: ignore[attr-defined]
    assert not [c for c in draft.job_calls or [] if c.call == "gc.collect"]


@pytest.mark.slow
def test_the_trainers_own_emptying_is_charged_to_its_setting(
    calls: object, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    """A real Trainer with torch_empty_cache_steps=1, its accelerator backend read as CUDA (on this CPU
    machine torch.cuda.empty_cache() is then called and does nothing): each call is accelerate's, made on the
    Trainer's setting, under the job's trainer.train() line."""
    memory = pytest.importorskip("accelerate.utils.memory")
    transformers = pytest.importorskip("transformers")
    import torch
    from tests.scripts.common import TokenDataset, examples, pad_collate, tiny_llama

    from pitstop.core.profile import RankProfile

    monkeypatch.setattr(memory, "get_torch_accelerator_backend", lambda: ("cuda", torch.cuda))
    trainer = transformers.Trainer(
        model=tiny_llama("sdpa", layers=1),
        args=transformers.TrainingArguments(
            output_dir=str(tmp_path),
            per_device_train_batch_size=2,
            max_steps=3,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            torch_empty_cache_steps=1,
        ),
        train_dataset=TokenDataset(examples(8, 0)),
        data_collator=pad_collate(None),
    )
    line = sys._getframe().f_lineno + 1
    trainer.train()
    draft = RankProfile()
    calls.fill(draft)  # type: ignore[attr-defined]
    assert draft.job_calls is not None
    # the Trainer also frees memory once on its own (no setting): a separate site, not a per-step call
    (made,) = [c for c in draft.job_calls if c.call == "torch.cuda.empty_cache" and c.setting]
    assert made.count == 3 and made.setting == "TrainingArguments(torch_empty_cache_steps=1)"
    assert made.via is not None and made.via.startswith("accelerate/utils/memory.py:")
    assert made.site.startswith(f"{__file__}:{line} in ")
