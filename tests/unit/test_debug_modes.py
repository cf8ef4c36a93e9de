"""debug_modes: the rule on hand-made profiles (which modes cost where, the estimate only for anomaly
detection), the advice naming the job's line, and the collector driven through the probe's listener calls
with real ``torch.autograd`` anomaly switches (global, per-step context, switched off mid-window)."""

from __future__ import annotations

import json

import pytest
from tests.factories import profile, steps

from pitstop.core.profile import DebugModes, RankProfile, RunProfile
from pitstop.core.vocabulary import CauseId, RemedyId, Severity
from pitstop.diagnose import diagnose
from pitstop.diagnose.document import read_run


def _with(modes: DebugModes, device: str = "cpu", ranks: int = 1) -> RunProfile:
    p = profile(device, steps(n=10), util=60.0 if device == "cuda" else None, ranks=ranks)
    for rank in p.ranks:
        rank.debug_modes = modes
    return p


def _finding(p: RunProfile):  # type: ignore[no-untyped-def]
    return next((f for f in diagnose(p).findings if f.cause == CauseId.DEBUG_MODES), None)


def test_anomaly_detection_on_every_step_is_found_with_its_line_and_a_cost() -> None:
    f = _finding(_with(DebugModes(anomaly_steps=10, anomaly_site="train.py:42")))
    assert f is not None and f.title == "Debug modes left on"
    assert f.evidence["anomaly_detection_steps"] == 10 and f.evidence["anomaly_site"] == "train.py:42"
    assert f.est_speedup is not None and f.est_speedup > 1.5 and f.severity == Severity.HIGH
    assert "train.py:42" in f.summary and "train.py:42" in f.fix.text
    assert f.fix.uses[0].remedy == RemedyId.DEBUG_OFF
    assert "set_detect_anomaly(False)" in (f.fix.snippets["pytorch"])
    assert "detect_anomaly=False" in f.fix.snippets["lightning"]


def test_anomaly_detection_in_a_few_steps_is_not_a_finding() -> None:
    assert _finding(_with(DebugModes(anomaly_steps=2, anomaly_site="train.py:42"))) is None


def test_settings_count_only_where_they_cost() -> None:
    blocking = DebugModes(settings=["CUDA_LAUNCH_BLOCKING=1"])
    assert _finding(_with(blocking, "cpu")) is None  # no kernel launches to block on a CPU
    f = _finding(_with(blocking, "cuda"))
    assert f is not None and f.est_speedup is None and "not estimated" in f.speedup_basis
    assert (
        "Unset CUDA_LAUNCH_BLOCKING" in f.fix.text
        and "unset CUDA_LAUNCH_BLOCKING" in f.fix.snippets["pytorch"]
    )
    detail = DebugModes(settings=["TORCH_DISTRIBUTED_DEBUG=DETAIL"])
    assert _finding(_with(detail, "cpu")) is None  # one process: no collectives to check
    assert _finding(_with(detail, "cpu", ranks=2)) is not None


def test_no_modes_no_finding_and_offline_sources_are_silent() -> None:
    assert _finding(_with(DebugModes())) is None
    assert _finding(profile("cpu", steps(n=10))) is None  # not watched (None): nothing said


def test_the_modes_survive_the_document_round_trip() -> None:
    p = _with(DebugModes(anomaly_steps=10, anomaly_site="train.py:42", settings=["CUDA_LAUNCH_BLOCKING=1"]))
    back = RunProfile.from_dict(json.loads(json.dumps(p.to_dict())))
    assert back.ranks[0].debug_modes == p.ranks[0].debug_modes
    doc = json.loads(json.dumps(diagnose(p).to_dict()))
    assert [f.cause for f in read_run(doc).findings if f.cause == CauseId.DEBUG_MODES]


torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")


def _probe_run(job_step) -> DebugModes:  # type: ignore[no-untyped-def]
    """A probe whose only patch is the debug-modes collector's (the job's steps come through the listener
    calls, as in test_probe_collectors), around a job that switches anomaly detection with torch's own calls."""
    from tests.unit.test_probe_collectors import Job

    from pitstop.probe.collectors.debug_modes import DebugModesCollector
    from pitstop.probe.config import ProbeConfig
    from pitstop.probe.probe import Probe

    done: list[RankProfile] = []
    probe = Probe(ProbeConfig(warmup=2, steps=4, announce=False), on_done=done.append)
    next(c for c in probe.collectors if isinstance(c, DebugModesCollector)).install()
    probe.hooks.active = True
    try:
        job = Job(probe)
        for step in range(8):
            job_step(step)
            job.run(1)
    finally:
        probe.hooks.remove()  # the probe removed it when its window ended; safe twice
        torch.autograd.set_detect_anomaly(False)
    assert done and done[0].debug_modes is not None
    assert not hasattr(torch.set_anomaly_enabled, "__wrapped__")  # torch's own function again
    return done[0].debug_modes


def test_the_collector_sees_anomaly_detection_switched_on_globally_and_where() -> None:
    modes = _probe_run(lambda step: torch.autograd.set_detect_anomaly(True) if step == 0 else None)
    assert modes.anomaly_steps == 4
    assert modes.anomaly_site is not None and modes.anomaly_site.startswith(__file__)


def test_the_collector_counts_a_context_entered_every_step() -> None:
    def step(_: int) -> None:
        with torch.autograd.detect_anomaly():  # on inside the step, off again before its end
            assert torch.is_anomaly_enabled()

    assert _probe_run(step).anomaly_steps == 4


def test_the_collector_stops_counting_once_the_job_switches_it_off() -> None:
    def step(i: int) -> None:
        torch.autograd.set_detect_anomaly(i < 4)  # on through the window's first steps, then off

    modes = _probe_run(step)
    assert 1 <= modes.anomaly_steps < 4


def test_a_profiler_left_running_is_named_with_no_estimate() -> None:
    from pitstop.probe.collectors.debug_modes import PYTHON_PROFILER, TORCH_PROFILER

    f = _finding(_with(DebugModes(profilers=[TORCH_PROFILER, PYTHON_PROFILER])))
    assert f is not None and f.evidence["profilers"] == [TORCH_PROFILER, PYTHON_PROFILER]
    assert f.est_speedup is None and "torch.profiler" in f.summary and "cProfile" in f.summary
    assert "Stop torch.profiler" in f.fix.text


def test_the_collector_sees_a_profiler_and_a_tracer_running_as_the_window_starts() -> None:
    import cProfile
    import sys

    from pitstop.probe.collectors.debug_modes import PYTHON_PROFILER, PYTHON_TRACER, TORCH_PROFILER

    python_profiler = cProfile.Profile()
    tracer = sys.gettrace()  # a debugger or coverage running the tests keeps its own
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        python_profiler.enable()
        try:
            modes = _probe_run(lambda step: None)
        finally:
            python_profiler.disable()
    assert TORCH_PROFILER in modes.profilers and PYTHON_PROFILER in modes.profilers
    assert (PYTHON_TRACER in modes.profilers) == (tracer is not None)
    assert _probe_run(lambda step: None).profilers == ([PYTHON_TRACER] if tracer is not None else [])


# -- debug_off's trial: the job's requests to switch a mode on are handed over as off ------------------------
@pytest.fixture
def armed(tmp_path):  # type: ignore[no-untyped-def]
    """debug_off's trial hook installed on the real torch (as a trial process does when torch is imported);
    torch's functions and the optimizer hooks are put back afterwards."""
    from torch.optim import optimizer as optim_mod

    from pitstop.remedies import remedy
    from pitstop.trials.request import FixReport, FixRequest

    saved = (torch.set_anomaly_enabled, torch.use_deterministic_algorithms)
    hooks = dict(optim_mod._global_optimizer_pre_hooks)
    report = FixReport(tmp_path / "fixes.json")
    remedy(RemedyId.DEBUG_OFF).on_import()["torch"](torch, FixRequest(), report)
    try:
        yield report
    finally:
        torch.set_anomaly_enabled, torch.use_deterministic_algorithms = saved
        torch.autograd.set_detect_anomaly(False)
        torch.use_deterministic_algorithms(False)
        optim_mod._global_optimizer_pre_hooks.clear()
        optim_mod._global_optimizer_pre_hooks.update(hooks)


def _losses(steps: int = 3) -> list[float]:
    """A small model trained under set_detect_anomaly(True) and detect_anomaly(), as the job asks."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    torch.autograd.set_detect_anomaly(True)
    seen = []
    for _ in range(steps):
        with torch.autograd.detect_anomaly():
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        seen.append(loss.item())
    return seen


def test_the_trial_keeps_anomaly_detection_off_and_trains_the_same_losses(armed) -> None:  # type: ignore[no-untyped-def]
    kept_off = _losses()  # the job asks for anomaly detection; the trial hands that over as off
    assert not torch.is_anomaly_enabled()  # the job's set_detect_anomaly(True) was handed over as off
    applied = armed.applied[RemedyId.DEBUG_OFF]
    assert applied.startswith("anomaly detection kept off (") and __file__ in applied
    assert armed.params[RemedyId.DEBUG_OFF]["anomaly"] is True
    assert armed.params[RemedyId.DEBUG_OFF]["site"].startswith(f"{__file__}:")
    assert RemedyId.DEBUG_OFF not in armed.revoked  # still off at the first optimizer step
    torch.use_deterministic_algorithms(True)
    assert not torch.are_deterministic_algorithms_enabled()
    assert "torch.use_deterministic_algorithms(True) kept off" in armed.applied[RemedyId.DEBUG_OFF]
    unarmed = torch.set_anomaly_enabled.__wrapped__  # type: ignore[attr-defined]
    torch.set_anomaly_enabled = unarmed  # the same job with anomaly detection on, as it asked
    assert _losses() == kept_off


def test_a_mode_switched_on_past_the_trial_revokes_it(armed) -> None:  # type: ignore[no-untyped-def]
    torch.autograd.set_detect_anomaly(True)
    torch.set_anomaly_enabled.__wrapped__(True)  # type: ignore[attr-defined]  # some other way in
    model = torch.nn.Linear(2, 1)
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert "anomaly detection still on" in armed.revoked[RemedyId.DEBUG_OFF]


def test_the_trial_unsets_the_debugging_variables_and_c10ds_level(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    from pitstop.remedies.debug_off import _unset_debug_env

    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    dist.set_debug_level(dist.DebugLevel.DETAIL)  # as torch read it at import
    try:
        assert _unset_debug_env(torch) == ["CUDA_LAUNCH_BLOCKING=1", "TORCH_DISTRIBUTED_DEBUG=DETAIL"]
        assert dist.get_debug_level() == dist.DebugLevel.OFF
        import os

        assert "CUDA_LAUNCH_BLOCKING" not in os.environ and "TORCH_DISTRIBUTED_DEBUG" not in os.environ
    finally:
        dist.set_debug_level(dist.DebugLevel.OFF)
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "0")  # already off: left alone
    assert _unset_debug_env(torch) == []


def test_a_trainers_full_determinism_becomes_the_same_seed_without_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from types import SimpleNamespace

    from pitstop.core.findings import use
    from pitstop.core.vocabulary import Framework
    from pitstop.remedies import advise, remedy
    from pitstop.trials.request import FixReport, FixRequest

    report = FixReport(tmp_path / "fixes.json")
    args = SimpleNamespace(full_determinism=True, seed=42)
    remedy(RemedyId.DEBUG_OFF).rewrite_training_args(args, FixRequest(), report)
    assert args.full_determinism is False and "full_determinism=False" in report.applied[RemedyId.DEBUG_OFF]
    fix = advise(Framework.HF_TRAINER, use(RemedyId.DEBUG_OFF, **report.params[RemedyId.DEBUG_OFF]))
    assert "full_determinism=True" in fix.text and "full_determinism=False" in fix.snippets["hf_trainer"]
