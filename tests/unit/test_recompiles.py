"""recompiles: the rule on hand-made profiles (compile time in the window, the recompile limit, a config alone
says nothing, a log's limit warning at a lower confidence), the advice per framework, the bucket collate
(same loss as the batch it pads, on a real tiny Llama), and the collector driven through the probe's listener
calls around real torch.compile recompiles (backend "eager": dynamo's own records, no code generation)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.factories import profile, steps

from pitstop.core.profile import CompileStats, RankProfile, RunProfile
from pitstop.core.vocabulary import CauseId, Framework, RemedyId, Severity, Source
from pitstop.diagnose import diagnose
from pitstop.diagnose.causes.recompiles import MIN_COMPILE_SHARE, OFFLINE_CONFIDENCE
from pitstop.diagnose.document import read_run
from pitstop.remedies import remedy


def _with(stats: CompileStats | None, n: int = 20, wall: float = 0.5, **env: Any) -> RunProfile:
    p = profile("cpu", steps(n=n, wall=wall), **env)
    p.source = Source.DOCTOR
    for rank in p.ranks:
        rank.compile = stats
    return p


def _finding(p: RunProfile):  # type: ignore[no-untyped-def]
    return next((f for f in diagnose(p).findings if f.cause == CauseId.RECOMPILES), None)


CURRICULUM = CompileStats(
    compiled_frames=3,
    recompiles=3,
    compile_s=5.0,  # of a 10 s window (20 steps of 0.5 s)
    steps_compiling=3,
    reasons=["tensor 'kwargs['input_ids']' size mismatch at index 1"],
    dynamic=False,
    site="train.py:42",
    recompile_limit=64,
)


def test_recompiles_that_take_half_the_window_are_found_with_their_reason_and_line() -> None:
    f = _finding(_with(CURRICULUM))
    assert f is not None and f.title == "torch.compile recompiles in the training loop"
    ev = f.evidence
    assert ev["recompiles"] == 3 and ev["steps_compiling"] == 3 and ev["steps_measured"] == 20
    assert ev["compile_share"] == pytest.approx(0.5) and ev["dynamic"] is False
    assert ev["reasons"] == ["tensor 'kwargs['input_ids']' size mismatch at index 1"]
    assert ev["compile_site"] == "train.py:42" and ev["source"] == "probe"
    assert f.est_speedup == pytest.approx(2.0) and f.severity == Severity.HIGH and f.confidence == 0.9
    assert "size mismatch at index 1" in f.summary and "dynamic=False (train.py:42)" in f.summary
    assert [u.remedy for u in f.fix.uses] == [RemedyId.DYNAMIC_COMPILE, RemedyId.LENGTH_BUCKETS]
    assert "Drop dynamic=False from torch.compile at train.py:42" in f.fix.text
    assert "dynamic=True" in f.fix.snippets["pytorch"] and "mark_dynamic" in f.fix.snippets["pytorch"]


def test_the_estimate_takes_the_compiling_steps_whole_excess_over_a_plain_step() -> None:
    """Dynamo's records miss a new graph's first run: the compiling steps' time beyond a plain step counts."""
    p = _with(None, n=20, wall=0.1)
    for s in p.ranks[0].steps:
        if s.index in (5, 10, 15):
            s.wall_s = 2.0  # 1.5 s of dynamo's compiling, 0.4 s more than a plain step besides
    p.ranks[0].compile = CompileStats(
        recompiles=3, compile_s=4.5, steps_compiling=3, compiling_steps=[5, 10, 15], dynamic=False
    )
    f = _finding(p)
    assert f is not None and f.evidence["compiling_steps_excess_s"] == pytest.approx(5.7)
    assert f.est_speedup == pytest.approx(7.7 / 2.0)  # 7.7 s of window, 5.7 s of it going
    assert "first run" in f.speedup_basis


def test_one_recompile_or_a_small_share_is_no_finding() -> None:
    one = CompileStats(compiled_frames=1, recompiles=1, compile_s=5.0, steps_compiling=1, dynamic=False)
    assert _finding(_with(one)) is None  # a last short batch of an epoch compiles once
    small = CompileStats(recompiles=4, compile_s=10.0 * MIN_COMPILE_SHARE / 2, steps_compiling=4)
    assert _finding(_with(small)) is None


def test_the_recompile_limit_is_found_without_an_estimate() -> None:
    limit = CompileStats(
        cache_limit_hit=True,
        recompile_limit=8,
        limit_frame="'forward' (modeling_llama.py:400)",
        reasons=["tensor 'kwargs['input_ids']' size mismatch at index 1"],
        dynamic=False,
        site="train.py:42",
    )
    f = _finding(_with(limit))
    assert f is not None and f.est_speedup is None and f.severity == Severity.MEDIUM
    assert "what eager costs against the compiled graph is not measured" in f.speedup_basis
    assert f.evidence["limit_frame"] == "'forward' (modeling_llama.py:400)"
    assert f.summary.startswith("A frame 'forward' (modeling_llama.py:400) reached the recompile limit (8)")


def test_a_configured_dynamic_false_alone_says_nothing_and_words_the_fix_when_evidence_comes() -> None:
    assert _finding(_with(None, compile_dynamic=False, torch_compile=True)) is None
    assert _finding(_with(CompileStats(), compile_dynamic=False)) is None  # compiled, no recompile: fine
    p = _with(CompileStats(cache_limit_hit=True, recompile_limit=8), compile_dynamic=False)
    p.source = Source.ANALYZE  # dynamo's "hit config.recompile_limit" warning read from a log
    f = _finding(p)
    assert f is not None and f.confidence == OFFLINE_CONFIDENCE and f.evidence["source"] == "log"
    assert f.evidence["configured_dynamic"] is False and "Drop dynamic=False" in f.fix.text


def test_a_job_that_compiles_dynamically_is_told_to_bucket_its_lengths() -> None:
    stats = CompileStats(recompiles=5, compile_s=6.0, steps_compiling=5, dynamic=True, reasons=["x"])
    f = _finding(_with(stats))
    assert f is not None and [u.remedy for u in f.fix.uses] == [RemedyId.LENGTH_BUCKETS]


def test_the_stats_survive_the_document_round_trip() -> None:
    p = _with(CURRICULUM)
    back = RunProfile.from_dict(json.loads(json.dumps(p.to_dict())))
    assert back.ranks[0].compile == CURRICULUM
    doc = json.loads(json.dumps(diagnose(p).to_dict()))
    assert [f.cause for f in read_run(doc).findings if f.cause == CauseId.RECOMPILES]


def test_the_advice_fits_each_framework() -> None:
    dyn = remedy(RemedyId.DYNAMIC_COMPILE)
    trainer = dyn.advice(Framework.HF_TRAINER, {"dynamic": False})
    assert "torch_compile=True" in trainer.snippet and "ACCELERATE_DYNAMO_USE_DYNAMIC" in trainer.snippet
    assert "TorchDynamoPlugin" in dyn.advice(Framework.ACCELERATE, {}).snippet
    buckets = remedy(RemedyId.LENGTH_BUCKETS)
    assert "pad_to_multiple_of=64" in buckets.advice(Framework.HF_TRAINER, {}).snippet
    assert "def bucket" in buckets.advice(Framework.PYTORCH, {}).snippet


torch = pytest.importorskip("torch")


def test_bucket_lengths_are_few_and_close() -> None:
    from pitstop.trials.collate import bucket_length

    lengths = {bucket_length(n) for n in range(17, 513)}
    assert lengths == {24, 32, 48, 64, 96, 128, 192, 256, 384, 512}
    assert all(n <= bucket_length(n) < 1.5 * n + 1 for n in range(16, 2049))


def test_a_bucket_padded_batch_trains_the_same_loss() -> None:
    """The new columns are padding after every real token: a real tiny Llama's loss is the same."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
    from common import examples, pad_collate, tiny_llama

    from pitstop.trials.collate import PadToBucket

    torch.manual_seed(0)
    model = tiny_llama("sdpa")
    rows = [{"input_ids": e} for e in examples(4, 1, lo=20, hi=70)]
    plain = pad_collate(None)(rows)
    padded = PadToBucket(pad_collate(None))(rows)
    width = plain["input_ids"].shape[1]
    assert padded["input_ids"].shape[1] > width and padded["input_ids"].shape[1] in (48, 64, 96)
    assert bool((padded["labels"][:, width:] == -100).all()) and not padded["attention_mask"][:, width:].any()
    with torch.no_grad():
        a, b = float(model(**plain).loss), float(model(**padded).loss)
    assert b == pytest.approx(a, rel=1e-5)
    no_mask = {"input_ids": plain["input_ids"]}
    assert PadToBucket(lambda _: no_mask)(rows) is no_mask  # nothing says where the padding is: left alone


def _probe_run(job_step, steps: int = 8, limit: int | None = None) -> RankProfile:  # type: ignore[no-untyped-def]
    """A probe whose only patch is the compile collector's, stepped through the listener calls (as in
    test_probe_collectors), around a job step that calls torch.compile'd code."""
    import torch._dynamo
    from tests.unit.test_probe_collectors import Job

    from pitstop.probe.collectors.compiles import CompileCollector
    from pitstop.probe.config import ProbeConfig
    from pitstop.probe.probe import Probe

    torch._dynamo.reset()
    torch._dynamo.utils.clear_compilation_metrics()
    done: list[RankProfile] = []
    probe = Probe(ProbeConfig(warmup=2, steps=4, announce=False), on_done=done.append)
    next(c for c in probe.collectors if isinstance(c, CompileCollector)).install()
    probe.hooks.active = True
    patched = torch._dynamo.config.patch(recompile_limit=limit) if limit else torch._dynamo.config.patch()
    try:
        with patched:
            job = Job(probe)
            for step in range(steps):
                job_step(step)
                job.run(1)
    finally:
        probe.hooks.remove()
        torch._dynamo.reset()
    assert done
    assert not hasattr(torch.compile, "__wrapped__")  # torch's own function again
    return done[0]


def _double(x):  # type: ignore[no-untyped-def]
    return x * 2 + 1


def test_the_collector_counts_recompiles_in_the_window_with_their_reason_and_the_call() -> None:
    calls: list[object] = []

    def step(i: int) -> None:
        if not calls:
            calls.append(torch.compile(_double, backend="eager", dynamic=False))
        calls[0](torch.ones(i + 1))  # type: ignore[operator]  # a new length every step

    rank = _probe_run(step)
    stats = rank.compile
    assert stats is not None
    assert stats.recompiles == 4 and stats.steps_compiling == 4 and stats.compiled_frames == 4
    assert stats.compiling_steps == [3, 4, 5, 6]
    assert stats.compile_s > 0 and stats.compiles_before_window == 2
    assert (
        stats.reasons
        and "size mismatch at index 0" in stats.reasons[0]
        and "expected" not in stats.reasons[0]
    )
    assert stats.dynamic is False and stats.site is not None and stats.site.startswith(__file__)
    assert not stats.cache_limit_hit


def test_the_collector_sees_a_frame_reach_the_recompile_limit() -> None:
    calls: list[object] = []

    def step(i: int) -> None:
        if not calls:
            calls.append(torch.compile(_double, backend="eager", dynamic=False))
        calls[0](torch.ones(i + 1))  # type: ignore[operator]

    stats = _probe_run(step, limit=3).compile
    assert stats is not None and stats.cache_limit_hit and stats.recompile_limit == 3
    assert stats.limit_frame is not None and "'_double'" in stats.limit_frame
    # the 3rd compile came at the window's first step; past the limit nothing compiles: new lengths run eagerly
    assert stats.recompiles == 1 and stats.steps_compiling == 1


def test_fixed_shapes_compile_once_before_the_window_and_no_compile_is_none() -> None:
    calls: list[object] = []

    def step(i: int) -> None:
        if not calls:
            calls.append(torch.compile(_double, backend="eager"))
        calls[0](torch.ones(4))  # type: ignore[operator]

    stats = _probe_run(step).compile
    assert stats is not None and stats.recompiles == 0 and stats.compile_s == 0.0
    assert stats.compiles_before_window == 1 and stats.dynamic is None
    assert _probe_run(lambda i: None).compile is None  # torch.compile not used
