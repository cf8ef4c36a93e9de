"""Files pitstop opens for reading are regular files, checked before the open (issue 25 item 3).

A FIFO as the history used to hang ``analyze --history f.db`` and ``history list`` forever (SQLite's open
blocks on it). The history, a saved result for ``pitstop report``, a git HEAD read for the label, and the
artifacts ``analyze`` reads all go through the same check the trace readers use
(``pitstop.regular.regular_problem``): one line naming the file and what it is, exit 2, nothing
opened. Every FIFO is made in the test's own temporary folder. If the check were missing these tests would
block, so each CLI call runs under a watchdog thread that fails the test instead of hanging the suite.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from tests.inprocess import cli
from tests.unit.test_history import run_doc

from pitstop.history import HistoryError, open_store, record
from pitstop.history.gitinfo import git_head
from pitstop.regular import regular_problem

T = TypeVar("T")


def within(seconds: float, action: Callable[[], T]) -> T:
    """``action()`` (its exception re-raised here), or a failed test when it does not return in time: it
    would be blocked on a FIFO."""
    done: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            done.append((True, action()))
        except BaseException as exc:  # handed to the test's thread
            done.append((False, exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if not done:
        pytest.fail(f"still blocked after {seconds} s: a FIFO was opened")
    ok, value = done[0]
    if not ok:
        raise value  # type: ignore[misc]
    return value  # type: ignore[return-value]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "f.db"
    os.mkfifo(path)
    return path


def test_history_list_on_a_fifo_is_one_line_and_exit_2(
    fifo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = within(20, lambda: cli(capsys, monkeypatch, "history", "list", "--history", str(fifo)))
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        f"pitstop: {fifo}: a FIFO (named pipe), not a file pitstop reads; left untouched"
    ]


def test_analyze_with_a_fifo_history_is_refused_before_reading(
    fifo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "gpu.csv"
    log.write_text(
        "timestamp, index, utilization.gpu [%], memory.used [MiB]\n2024/01/01 10:00:00.000, 0, 50 %, 1000 MiB\n"
    )
    code, out, err = within(20, lambda: cli(capsys, monkeypatch, "analyze", str(log), "--history", str(fifo)))
    assert code == 2 and out == ""  # refused before the log was read and reported
    assert err.strip().splitlines() == [
        f"pitstop: history {fifo}: a FIFO (named pipe), not a file pitstop reads; "
        "record elsewhere with --history PATH, or pass --no-history"
    ]


def test_recording_into_a_fifo_is_refused_without_opening_it(fifo: Path) -> None:
    with pytest.raises(HistoryError, match="a FIFO"):
        within(20, lambda: record(run_doc(), "analyze", fifo))
    with pytest.raises(HistoryError, match="a FIFO"):
        within(20, lambda: open_store(fifo, create=False))


def test_an_empty_history_file_is_still_a_new_history(tmp_path: Path) -> None:
    empty = tmp_path / "h.db"
    empty.touch()
    assert regular_problem(empty, empty_ok=True) is None
    assert record(run_doc(), "analyze", empty) == 1


def test_report_on_a_fifo_is_one_line(
    fifo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    html = str(tmp_path / "r.html")
    code, _, err = within(20, lambda: cli(capsys, monkeypatch, "report", str(fifo), "--html", html))
    assert code == 2
    assert "a FIFO (named pipe), not a file pitstop reads" in err and len(err.strip().splitlines()) == 1


def test_analyze_on_a_fifo_artifact_is_one_line(
    fifo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = within(20, lambda: cli(capsys, monkeypatch, "analyze", str(fifo), "--no-history"))
    assert code == 2 and "FIFO" in err and len(err.strip().splitlines()) == 1


def test_a_git_head_that_is_a_fifo_gives_no_label(tmp_path: Path) -> None:
    git = tmp_path / ".git"
    git.mkdir()
    os.mkfifo(git / "HEAD")
    assert within(20, lambda: git_head(tmp_path)) == (None, None)


def test_the_check_names_each_kind(tmp_path: Path, fifo: Path) -> None:
    assert regular_problem(tmp_path) == f"{tmp_path}: a folder, not a file pitstop reads"
    assert regular_problem(fifo) == f"{fifo}: a FIFO (named pipe), not a file pitstop reads"
    assert regular_problem(tmp_path / "missing") is None  # missing is the caller's to judge
    link = tmp_path / "link"
    link.symlink_to(fifo)
    assert "FIFO" in (regular_problem(link) or "")  # links are followed
