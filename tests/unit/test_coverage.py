""" "No finding" means "checked, and nothing found" (issue 43): every diagnosis says which causes were checked
on what evidence and which could not be, and why; an input pitstop could not analyse is never a clean bill
of health. Also item 9's first half: a folder of eight traces is read as eight."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from tests.conftest import require_shared
from tests.factories import well_tuned

from pitstop import schemas
from pitstop.core.profile import RankProfile, RunProfile, TraceStats
from pitstop.core.vocabulary import CauseId, Evidence, Source
from pitstop.diagnose import diagnose
from pitstop.diagnose.causes import CAUSES
from pitstop.diagnose.coverage import NEEDS_GPU, Coverage
from pitstop.diagnose.document import read_run
from pitstop.ingest.load import Inputs, load_run
from pitstop.report.html.run import verdict
from pitstop.report.terminal import render

RANKS = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "ranks"


def _terminal(d) -> str:
    out = io.StringIO()
    render(d, Console(file=out, width=200, color_system=None))
    return out.getvalue()


def test_every_cause_declares_evidence_of_known_kinds() -> None:
    for c in CAUSES.values():
        kinds = [k for need in c.needs for k in (need if isinstance(need, tuple) else (need,))]
        assert kinds and all(isinstance(k, Evidence) for k in kinds), c.id


def test_a_cpu_doctor_run_says_what_it_checked() -> None:
    profile = well_tuned("cpu")
    profile.source = Source.DOCTOR
    d = diagnose(profile)
    assert not d.findings
    cov = d.coverage
    assert cov.clean and cov.has(Evidence.STEPS) and cov.has(Evidence.PROCESS)
    gpu_only = {c.cause for c in cov.not_checked if c.why == NEEDS_GPU}
    assert gpu_only == set(d.skipped_checks)
    text = _terminal(d)
    assert f"No finding among the {len(cov.checked)} causes checked; not checked:" in text
    assert "Checked " in text and "Not checked " in text and "this run was on the CPU" in text


def test_a_trace_without_steps_is_not_a_clean_bill_of_health() -> None:
    rank = RankProfile(rank=0, trace=TraceStats(limitations=["no ProfilerStep spans"]))
    d = diagnose(RunProfile(source=Source.ANALYZE, ranks=[rank]))
    cov = d.coverage
    steps = cov.state(Evidence.STEPS)
    assert steps is not None and not steps.present and "no ProfilerStep" in steps.detail
    assert not cov.clean
    not_checked = {c.cause: c.why for c in cov.not_checked}
    assert (
        CauseId.LOW_MFU_UNEXPLAINED in not_checked
        and "step timing" in not_checked[CauseId.LOW_MFU_UNEXPLAINED]
    )
    text = _terminal(d)
    assert "not a clean bill of health" in text and "nothing in this run points" not in text
    assert "not a clean bill of health" in verdict(d)


def test_checks_travel_in_the_document_and_read_back() -> None:
    d = diagnose(well_tuned("cpu"))
    doc = d.to_dict()
    assert tuple(doc["checks"]) == schemas.RUN_CHECKS_KEYS
    assert doc["checks"]["checked"] == [str(c) for c in d.coverage.checked]
    back = read_run(doc)
    assert back.coverage.to_dict() == d.coverage.to_dict()
    del doc["checks"]  # an older document: recomputed from its profile
    assert read_run(doc).coverage.checked == d.coverage.checked
    newer = Coverage.from_dict({"checked": ["idle_gpu", "from_the_future"], "evidence": [{"kind": "new"}]})
    assert newer is not None and newer.checked == [CauseId.IDLE_GPU] and newer.evidence == []


def test_a_finding_counts_its_cause_as_checked() -> None:
    """A rule that found its fact another way than its declared needs is never listed as not checked."""
    d = diagnose(well_tuned("cpu"))
    assert not {f.cause for f in d.findings} & {c.cause for c in d.coverage.not_checked}


def test_a_folder_of_eight_traces_reads_as_eight() -> None:
    d = diagnose(load_run(Inputs(paths=[RANKS], jobs=1)))
    assert d.profile.command == [str(RANKS)]  # one path given
    text = _terminal(d)
    assert "Read      8 traces (ranks 0-7)" in text and "1 input(s)" not in text


def test_a_real_gpu_log_times_no_steps() -> None:
    """An nvidia-smi log of an RTX 4090 (an evaluation job): utilization, no training steps."""
    path = require_shared("nvidia_smi/eobo0530__vlm_optimization__gpu_log.csv")
    d = diagnose(load_run(Inputs(paths=[path])))
    cov = d.coverage
    util = cov.state(Evidence.GPU_UTILIZATION)
    assert util is not None and util.present and "nvidia-smi log" in util.detail
    steps = cov.state(Evidence.STEPS)
    assert steps is not None and steps.detail == "a GPU log times no training steps"
    assert CauseId.SMALL_BATCH in cov.checked or any(f.cause == CauseId.SMALL_BATCH for f in d.findings)
    assert not cov.clean


def test_each_cause_is_listed_once_and_the_counts_add_up_to_the_catalogue() -> None:
    """A cause with a finding is checked once (not again from its needs): checked + not checked is every cause."""
    from pitstop.diagnose.coverage import coverage_of

    causes = list(CAUSES.values())
    coverage = coverage_of(well_tuned(), causes, found=[c.id for c in causes[:3]])
    listed = coverage.checked + [c.cause for c in coverage.not_checked]
    assert sorted(listed) == sorted(c.id for c in causes)
