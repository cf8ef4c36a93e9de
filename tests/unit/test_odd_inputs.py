"""Odd inputs that used to end in an internal error or a misleading message (issue 25 items 6, 7 and 8).

Item 6: ``history show 99999999999999999999999`` (OverflowError), ``pitstop report`` on 100,000 ``[``
(RecursionError), a watch window whose step is a 400-digit integer (OverflowError in the HTML report): each
is one line and exit 2. Item 7: nvidia-smi timestamps in ISO-8601 or ``dd.mm.yyyy`` are read, one pitstop
cannot read is named as such (not blamed on a decimal-comma locale), a ``[GiB]`` memory column is converted
(an unknown unit is a note, never a silent drop), and ``HOME=""`` never puts the history under
``/.local/share``. Item 8: ``--dask`` without the extra names the extra to install.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from tests.inprocess import cli
from tests.unit.test_watch_cli_parts import _report

from pitstop.artifacts import IngestError
from pitstop.history import HistoryError, default_path
from pitstop.history import paths as history_paths
from pitstop.ingest.nvidia_smi import read_smi

MIB = 2**20


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "internal error" not in lines[0] and "Traceback" not in err
    return lines[0]


# -- item 6: internal errors ------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["show", "99999999999999999999999"], ["compare", "1", str(2**64)]])
def test_a_run_id_beyond_sqlite_is_no_such_run(
    args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.unit.test_history import run_doc

    from pitstop.history import record

    path = tmp_path / "h.db"
    record(run_doc(), "doctor", path)
    code, _, err = cli(capsys, monkeypatch, "history", *args, "--history", str(path))
    assert code == 2
    assert _one_line(err).startswith("pitstop: no run #")


def test_a_list_limit_beyond_sqlite_lists_them_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.unit.test_history import run_doc

    from pitstop.history import record

    path = tmp_path / "h.db"
    record(run_doc(), "doctor", path)
    code, out, err = cli(
        capsys, monkeypatch, "history", "list", "--limit", "9" * 23, "--json", "--history", str(path)
    )
    assert code == 0, err
    assert [r["id"] for r in json.loads(out)] == [1]


def test_report_on_json_nested_beyond_the_recursion_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    code, _, err = cli(capsys, monkeypatch, "report", str(deep), "--html", str(tmp_path / "r.html"))
    assert code == 2
    assert _one_line(err) == f"pitstop: {deep}: JSON nested too deeply to be a pitstop result"


def test_report_on_a_watch_window_whose_step_has_400_digits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, doc = _report()
    doc["watch"]["windows"][0]["last_step"] = int("9" * 400)  # type: ignore[index]
    saved = tmp_path / "watch.json"
    saved.write_text(json.dumps(doc))
    html = tmp_path / "r.html"
    code, _, err = cli(capsys, monkeypatch, "report", str(saved), "--html", str(html))
    assert code == 2
    assert _one_line(err).startswith("pitstop: the document is damaged: OverflowError")
    assert not html.exists()


# -- item 7: nvidia-smi timestamps and units, HOME="" -----------------------------------------------------

HEADER = "timestamp, index, utilization.gpu [%], memory.used [MiB]\n"


@pytest.mark.parametrize(
    "stamps",
    [
        ("2024-02-01T10:00:00.000", "2024-02-01T10:00:01.500"),
        ("2024-02-01T10:00:00Z", "2024-02-01T10:00:01.5+00:00"),
        ("01.02.2024 10:00:00.000", "01.02.2024 10:00:01.500"),
    ],
)
def test_iso_and_day_first_timestamps_are_read(stamps: tuple[str, str], tmp_path: Path) -> None:
    log = tmp_path / "smi.csv"
    log.write_text(HEADER + "".join(f"{t}, 0, {50 + i} %, 1000 MiB\n" for i, t in enumerate(stamps)))
    smi = read_smi(log)
    assert [s.t for s in smi.gpus[0].samples] == [0.0, 1.5]
    assert smi.skipped_rows == 0 and smi.notes == []


def test_an_unreadable_timestamp_is_named_not_blamed_on_the_locale(tmp_path: Path) -> None:
    log = tmp_path / "smi.csv"
    log.write_text(HEADER + "1706781600, 0, 50 %, 1000 MiB\n1706781601, 0, 60 %, 1000 MiB\n")
    with pytest.raises(IngestError) as refused:
        read_smi(log)
    message = str(refused.value)
    assert "2 with a timestamp pitstop cannot read ('1706781600'" in message and "ISO-8601" in message
    assert "decimal-comma" not in message


def test_decimal_commas_are_still_blamed_on_the_locale(tmp_path: Path) -> None:
    log = tmp_path / "smi.csv"
    log.write_text(
        "timestamp, index, power.draw [W], utilization.gpu [%]\n"
        "2024/01/01 10:00:00.000, 0, 33,09 W, 50 %\n2024/01/01 10:00:01.000, 0, 33.1 W, 60 %\n"
    )
    smi = read_smi(log)
    assert len(smi.gpus[0].samples) == 1
    assert smi.notes == [
        "smi.csv: 1 rows skipped: 1 with more cells than the header (a decimal-comma locale? log with LC_ALL=C)"
    ]


def test_a_gib_memory_column_is_converted(tmp_path: Path) -> None:
    log = tmp_path / "smi.csv"
    log.write_text(
        "timestamp, index, utilization.gpu [%], memory.used [GiB], memory.total [GiB]\n"
        "2024/01/01 10:00:00.000, 0, 50 %, 1.5 GiB, 80 GiB\n2024/01/01 10:00:01.000, 0, 60 %, 2, 80\n"
    )
    samples = read_smi(log).gpus[0].samples
    assert [(s.mem_used, s.mem_total) for s in samples] == [
        (int(1.5 * 1024 * MIB), 80 * 1024 * MIB),
        (2 * 1024 * MIB, 80 * 1024 * MIB),  # no unit on the value: the header's
    ]


def test_an_unknown_memory_unit_is_a_note_not_a_silent_drop(tmp_path: Path) -> None:
    log = tmp_path / "smi.csv"
    log.write_text(
        "timestamp, index, utilization.gpu [%], memory.used [pages]\n"
        "2024/01/01 10:00:00.000, 0, 50 %, 1000\n2024/01/01 10:00:01.000, 0, 60 %, 1000\n"
    )
    smi = read_smi(log)
    assert [s.mem_used for s in smi.gpus[0].samples] == [None, None]
    assert smi.notes == [
        "smi.csv: memory in pages is not a unit pitstop converts; memory left out (log it in MiB, nvidia-smi's own unit)"
    ]


def test_an_empty_home_uses_the_password_database(monkeypatch: pytest.MonkeyPatch) -> None:
    import pwd

    monkeypatch.setenv("HOME", "")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.delenv("PITSTOP_HISTORY", raising=False)
    entry = Path(pwd.getpwuid(os.getuid()).pw_dir)
    if str(entry) == "/":
        pytest.skip("this user's home in the password database is /")
    assert default_path().parent == entry / ".local" / "share" / "pitstop" / "history"
    assert not str(default_path()).startswith("/.local")


def test_no_home_at_all_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pwd

    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(uid)

    monkeypatch.setenv("HOME", "")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.delenv("PITSTOP_HISTORY", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    with pytest.raises(HistoryError, match="no home folder"):
        default_path()
    with pytest.raises(HistoryError):
        history_paths.resolve_path("~/h.db")  # '~' against an empty HOME would be '/h.db'
    code, _, err = cli(capsys, monkeypatch, "history", "list")
    assert code == 2
    assert "give --history PATH or set PITSTOP_HISTORY" in _one_line(err)


# -- item 8: --dask without the extra ----------------------------------------------------------------------


def test_dask_without_the_extra_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # import fails as if not installed
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": []}')
    code, out, err = cli(capsys, monkeypatch, "analyze", str(trace), "--dask", "local")
    assert code == 2 and out == ""
    line = _one_line(err)
    assert "pip install 'pitstop[dask]'" in line and "ModuleNotFoundError" not in line
