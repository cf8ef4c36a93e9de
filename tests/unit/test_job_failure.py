"""A crashed job: the probe records its uncaught exception (chained, never changing what the job prints), the rank
file carries it, the runner joins it with the exit, the report leads with it, confidence follows the steps
measured, and the history keeps the run as failed, never as a baseline."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
from rich.console import Console
from tests.factories import profile, steps
from typer.testing import CliRunner

from pitstop.cli.app import app
from pitstop.core.findings import Finding, Fix
from pitstop.core.profile import JobFailure, RankProfile, RunProfile, StepRecord, to_jsonable
from pitstop.core.vocabulary import CauseId, Severity, Source
from pitstop.diagnose import FULL_CONFIDENCE_STEPS, confidence_by_steps, diagnose, failure_line
from pitstop.history import fingerprint, open_store, record
from pitstop.history.upgrade import previous_run
from pitstop.probe.collectors.failure import FailureCollector, raise_site
from pitstop.probe.config import ProbeConfig
from pitstop.probe.rankfile import Failed, Kind, decode, line, plain_step, read_text
from pitstop.report.html import render_html
from pitstop.report.terminal import render
from pitstop.runner.collect import collect, job_failure
from pitstop.runner.launch import Launch

HERE = Path(__file__).name


class Loader:
    """Stands in for a DataLoader and its iterator: the probe keys batches by identity only."""


CRASH = JobFailure(
    exception="RuntimeError",
    message="the user's callback failed at step 3\nsecond line",
    site="/home/u/newcomer_trainer.py:78",
    step=3,
    rank=0,
    at=100.0,
)


# -- the rank file: one line kind, written and read back ----------------------------------------------------


def test_a_failure_line_reads_back_as_written() -> None:
    read = decode(line(Kind.FAILURE, failure=to_jsonable(CRASH)))
    assert isinstance(read, Failed) and read.failure == CRASH
    assert decode('{"kind":"failure","failure":7}') is None  # damaged: skipped, as every kind is


def _steps_text(n: int) -> str:
    return line(Kind.START, rank=0, local_rank=0, pid=9, warmup=1) + "".join(
        line(Kind.STEP, step=plain_step(StepRecord(index=i, wall_s=0.1)), t=i) for i in range(1, n + 1)
    )


def test_a_rank_file_keeps_the_failure_whether_the_process_finished_or_died() -> None:
    failed = line(Kind.FAILURE, failure=to_jsonable(CRASH))
    died = read_text(_steps_text(3) + failed)  # killed before its atexit: rebuilt from its lines
    assert died is not None and not died[1] and died[0].failure == CRASH and len(died[0].steps) == 2
    finished = RankProfile(rank=0, steps=[StepRecord(index=2, wall_s=0.1)])
    after = read_text(_steps_text(2) + line(Kind.PROFILE, profile=to_jsonable(finished)) + failed)
    assert after is not None and after[1] and after[0].failure == CRASH  # a failure after the window joins it
    alone = read_text(failed)  # before the first step: the file holds the failure only
    assert alone is not None and alone[0].failure == CRASH and alone[0].steps == []
    assert read_text(_steps_text(2)) is not None and read_text(_steps_text(2))[0].failure is None  # type: ignore[index]


# -- the probe's hooks: chained, never changing what the job prints ---------------------------------------


def _raised(exc: BaseException) -> tuple[type[BaseException], BaseException, TracebackType | None]:
    try:
        raise exc
    except BaseException as caught:
        return type(caught), caught, caught.__traceback__


def _library_raises() -> tuple[type[BaseException], BaseException, TracebackType | None]:
    try:
        json.loads("{not json")  # raises inside the standard library
    except ValueError as caught:
        return type(caught), caught, caught.__traceback__
    raise AssertionError("json accepted it")


@pytest.fixture
def hooked(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[FailureCollector, list[Any], list[Any], list[Any]]]:
    """A FailureCollector installed over recording hooks (the job's own), its rank-file lines collected."""
    seen_sys: list[tuple[Any, ...]] = []
    seen_thread: list[Any] = []
    monkeypatch.setattr(sys, "excepthook", lambda *a: seen_sys.append(a))
    monkeypatch.setattr(threading, "excepthook", seen_thread.append)
    from pitstop.probe.probe import Probe

    probe = Probe(ProbeConfig(announce=False))
    hook = next(c for c in probe.collectors if isinstance(c, FailureCollector))
    lines: list[tuple[str, dict[str, Any]]] = []
    hook.attach(lambda kind, **payload: lines.append((kind, payload)), lambda: 3)
    hook.install()
    yield hook, seen_sys, seen_thread, lines
    hook.remove()


def test_the_hook_records_the_exception_and_hands_it_on_unchanged(hooked: Any) -> None:
    hook, seen_sys, _, lines = hooked
    exc_info = _library_raises()
    sys.excepthook(*exc_info)
    assert seen_sys == [
        exc_info
    ]  # the job's own hook got exactly what Python gave: same traceback, same exit
    failure = hook.failure
    assert failure is not None and failure.exception == "JSONDecodeError" and failure.step == 3
    assert failure.site is not None and failure.site.rsplit(":", 1)[0].endswith(
        HERE
    )  # the job's line, not json's
    assert lines == [(Kind.FAILURE, {"failure": to_jsonable(failure)})]
    draft = RankProfile()
    hook.fill(draft)
    assert draft.failure == failure


def test_an_interruption_is_not_a_failure_and_the_main_thread_wins(hooked: Any) -> None:
    hook, seen_sys, seen_thread, _ = hooked
    sys.excepthook(*_raised(KeyboardInterrupt()))  # pitstop's stop after the window, or the user's Ctrl-C
    assert hook.failure is None and len(seen_sys) == 1
    worker = threading.Thread(target=lambda: 1 / 0, name="loader-thread")
    worker.start()
    worker.join()
    assert len(seen_thread) == 1 and hook.failure is not None  # the thread's own hook still ran
    assert hook.failure.thread == "loader-thread" and hook.failure.exception == "ZeroDivisionError"
    sys.excepthook(*_raised(RuntimeError("boom")))
    assert hook.failure.exception == "RuntimeError" and hook.failure.thread is None


def test_the_hooks_are_put_back_without_a_rank_file(monkeypatch: pytest.MonkeyPatch) -> None:
    from pitstop.probe.probe import Probe

    before = sys.excepthook
    hook = next(c for c in Probe(ProbeConfig(announce=False)).collectors if isinstance(c, FailureCollector))
    hook.install()
    assert sys.excepthook is not before
    hook.remove()
    assert sys.excepthook is before


def test_the_site_is_the_innermost_line_of_the_jobs_own_code() -> None:
    *_, tb = _library_raises()
    site = raise_site(tb)
    assert site is not None and site.endswith(f"{HERE}:{_library_raises.__code__.co_firstlineno + 2}")


def test_the_step_is_the_one_under_way_or_the_last_closed() -> None:
    torch = pytest.importorskip("torch")
    from pitstop.probe.probe import Probe

    probe = Probe(ProbeConfig(warmup=10, steps=None, announce=False))
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    it, loader = Loader(), Loader()
    probe.on_iterator(it, loader)
    assert probe._failed_step() is None  # before the first step
    for _ in range(3):
        probe.on_batch(it, {"input_ids": torch.ones(2, 3, dtype=torch.long)}, 0.0)
        probe.on_forward(model, (), {})
        probe.on_backward(True)
        probe.on_backward(False)
        probe.on_optimizer(opt, True)
        probe.on_optimizer(opt, False)
    assert probe._failed_step() == 3  # a callback at step 3's end raised: step 3
    probe.on_batch(it, {"input_ids": torch.ones(2, 3, dtype=torch.long)}, 0.0)
    assert probe._failed_step() == 4  # step 4 had begun
    probe.hooks.remove()


# -- the runner: the exit joined with the exception -----------------------------------------------------------


def _died(out: Path, code: int, failure: JobFailure | None, steps_done: int = 3) -> Launch:
    text = _steps_text(steps_done) + (line(Kind.FAILURE, failure=to_jsonable(failure)) if failure else "")
    (out / "rank-9.jsonl").write_text(text)
    (out / "armed-9").write_text("python train.py")
    return Launch(command=["python", "train.py"], out_dir=out, exit_code=code)


def test_the_runner_joins_the_exit_and_the_exception(tmp_path: Path) -> None:
    outcome = collect(_died(tmp_path, 1, CRASH), requested_steps=50, requested_warmup=10)
    assert outcome.profile is not None and outcome.exit_code == 1
    failure = outcome.profile.failure
    assert failure is not None and failure.exit_code == 1 and failure.signal is None
    assert (failure.exception, failure.step, failure.site) == ("RuntimeError", 3, CRASH.site)


def test_a_death_by_signal_is_a_failure_without_an_exception(tmp_path: Path) -> None:
    outcome = collect(_died(tmp_path, -9, None), requested_steps=50, requested_warmup=1)
    assert outcome.profile is not None and outcome.profile.failure is not None
    assert outcome.profile.failure.signal == "SIGKILL" and outcome.profile.failure.exception is None
    assert failure_line(outcome.profile) == "The job was killed by SIGKILL after step 3"


def test_a_stop_or_a_clean_exit_is_no_failure(tmp_path: Path) -> None:
    stopped = Launch(["python", "train.py"], tmp_path, exit_code=1, stopped_by="SIGINT", interrupted=True)
    after_window = Launch(
        ["python", "train.py"], tmp_path, exit_code=0, ended_after_window=True, job_exit_code=1
    )
    for launch in (stopped, after_window, Launch(["python", "train.py"], tmp_path, exit_code=0)):
        assert job_failure(launch, [RankProfile(failure=CRASH)]) is None


def test_of_several_ranks_the_first_to_raise_is_the_cause(tmp_path: Path) -> None:
    later = JobFailure(exception="DistBackendError", message="timeout", rank=0, step=3, at=160.0)
    first = JobFailure(exception="ValueError", message="bad row", rank=1, step=3, at=100.0)
    thread = JobFailure(exception="OSError", rank=0, thread="saver", at=50.0)
    ranks = [
        RankProfile(rank=0, failure=later),
        RankProfile(rank=1, failure=first),
        RankProfile(failure=thread),
    ]
    found = job_failure(Launch(["torchrun", "train.py"], tmp_path, exit_code=1), ranks)
    assert found is not None and found.exception == "ValueError" and found.rank == 1


def test_a_crash_before_the_first_step_names_the_exception(tmp_path: Path) -> None:
    (tmp_path / "rank-9.jsonl").write_text(line(Kind.FAILURE, failure=to_jsonable(JobFailure(
        exception="FileNotFoundError", message="no data.jsonl", site="/x/train.py:12", rank=0
    ))))  # fmt: skip
    (tmp_path / "armed-9").write_text("python train.py")
    outcome = collect(Launch(["python", "train.py"], tmp_path, exit_code=1), 50, 10)
    assert outcome.profile is None and outcome.message is not None
    assert outcome.message.endswith(
        "before its first optimizer step: FileNotFoundError: no data.jsonl (train.py:12)"
    )


# -- confidence follows the steps measured ---------------------------------------------------------------------


def _finding(confidence: float) -> Finding:
    return Finding(CauseId.PADDING_WASTE, Severity.HIGH, confidence, "s", {}, 1.5, "b", Fix("t"))


def test_confidence_is_scaled_by_the_steps_measured() -> None:
    (two,), note = confidence_by_steps([_finding(0.9)], 2)
    assert two.confidence == pytest.approx(0.9 * 2 / FULL_CONFIDENCE_STEPS) and two.severity is Severity.LOW
    assert note is not None and f"2/{FULL_CONFIDENCE_STEPS}" in note
    (four,), _ = confidence_by_steps([_finding(0.9)], 4)
    assert four.confidence == pytest.approx(0.72) and four.severity is Severity.HIGH
    kept, none = confidence_by_steps([_finding(0.9)], FULL_CONFIDENCE_STEPS)
    assert kept[0].confidence == 0.9 and none is None
    assert (
        confidence_by_steps([_finding(0.9)], None)[0][0].confidence == 0.9
    )  # no step records: a log's totals


def _doctor(records: list[StepRecord], source: Source = Source.DOCTOR) -> RunProfile:
    prof = profile("cpu", records)
    prof.source = source
    return prof


def test_a_diagnosis_of_two_steps_never_says_ninety_percent() -> None:
    padded = steps(n=20, real_frac=0.35)
    full = diagnose(_doctor(padded))
    short = diagnose(_doctor(padded[:2]))
    assert full.findings and max(f.confidence for f in full.findings) >= 0.7  # the same evidence, 20 steps
    assert {f.cause for f in short.findings} == {f.cause for f in full.findings}
    cap = 2 / FULL_CONFIDENCE_STEPS
    assert all(f.confidence <= cap + 1e-9 for f in short.findings)
    assert all(f.severity is Severity.LOW for f in short.findings)
    assert any("only 2 steps measured" in n for n in short.notes)
    trace = diagnose(_doctor(padded[:2], Source.ANALYZE))  # a trace's kernels stand on more than its steps
    assert max(f.confidence for f in trace.findings) >= 0.7 and not any(
        "steps measured" in n for n in trace.notes
    )


# -- the report leads with the exit and the exception ------------------------------------------------------------


def _crashed_diagnosis() -> Any:
    prof = _doctor(steps(n=2, real_frac=0.35))
    prof.exit_code = 1
    prof.failure = JobFailure(**{**vars(CRASH), "exit_code": 1})
    return diagnose(prof)


def test_the_reports_lead_with_the_failure() -> None:
    d = _crashed_diagnosis()
    lead = "The job failed at step 3: RuntimeError: the user's callback failed at step 3 (newcomer_trainer.py:78)"
    assert failure_line(d.profile) == lead
    doc = d.to_dict()
    assert doc["failure"]["summary"] == lead and doc["failure"]["exception"] == "RuntimeError"
    assert doc["failure"]["step"] == 3 and doc["failure"]["exit_code"] == 1
    console = Console(record=True, width=200)
    render(d, console)
    text = console.export_text()
    after_panel = text.split("╯", 1)[1].strip().splitlines()
    assert after_panel[0] == lead
    assert text.index(lead) < text.index("Findings")
    page = render_html(d)
    assert 'data-figure="failure"' in page and "newcomer_trainer.py:78" in page
    assert page.index('data-figure="failure"') < page.index("Top findings")
    assert diagnose(_doctor(steps(n=2))).to_dict()["failure"] is None


# -- the history keeps a failed run, never as a baseline ----------------------------------------------------------


def test_a_failed_run_is_listed_as_failed_and_never_a_baseline(history_file: Path) -> None:
    good = diagnose(_doctor(steps(n=20))).to_dict()
    crashed = _crashed_diagnosis()
    crashed.profile.ranks[0].steps = steps(n=20)  # the same workload: the same fingerprint
    bad = diagnose(crashed.profile).to_dict()
    assert fingerprint(bad) == fingerprint(good)
    assert previous_run(bad, "doctor", history_file) is None
    record(bad, "doctor")
    assert previous_run(good, "doctor", history_file) is None  # the failed run is no baseline
    good_id = record(good, "doctor")
    failed_id = record(bad, "doctor")
    found = previous_run(good, "doctor", history_file)
    assert found is not None and found.run_id == good_id  # the newest run that did not fail
    with open_store(history_file, create=False) as store:
        latest = store.latest()
        assert latest is not None and latest.id == failed_id and latest.failed  # listed, kept
        assert store.latest(fingerprint=fingerprint(good)).id == good_id  # type: ignore[union-attr]
        assert store.latest(fingerprint=fingerprint(good), include_failed=True).id == failed_id  # type: ignore[union-attr]
        listed = {r.id: r.failure for r in store.list()}
    assert listed[good_id] is None and listed[failed_id] is not None
    assert (listed[failed_id] or "").startswith("The job failed at step 3: RuntimeError")
    shown = CliRunner().invoke(
        app, ["history", "list", "--history", str(history_file)], env={"COLUMNS": "200"}
    )
    assert shown.exit_code == 0, shown.output
    assert "doctor, failed" in shown.output and f"#{failed_id}: The job failed at step 3" in shown.output


def test_a_failure_without_its_line_still_reads_as_failed(history_file: Path) -> None:
    doc = diagnose(_doctor(steps(n=20))).to_dict()
    bare = record({**doc, "failure": {"exit_code": 3}}, "doctor")  # written by a tool that gave no summary
    record({**doc, "failure": None}, "doctor")
    with open_store(history_file, create=False) as store:
        assert [r.failure for r in store.list()] == [None, "failed"]
        assert store.latest(fingerprint=fingerprint(doc)).id == bare + 1  # type: ignore[union-attr]
