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
