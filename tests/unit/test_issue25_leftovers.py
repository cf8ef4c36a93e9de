"""Issue 25's leftovers: the last places an untrusted string reached the terminal as markup or escape codes,
the dask extra named from the Python API, the data layer's files checked to be regular files before the
open, and ``pitstop plan`` bounding its numbers. Nothing here starts a process; every FIFO is made in the
test's own temporary folder, and every read that could block runs under a watchdog."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from pitstop.diagnose.ranks import OpBandwidth, RankComm, RanksAnalysis, Scaling
from pitstop.report import ranks_view

HOSTILE = "[/a][red]x\x1b]8;;https://e.example/\x1b\\\x1b[2J\x9b1m"


def _render(renderable: Any) -> str:
    out = io.StringIO()
    Console(file=out, width=400, force_terminal=True, color_system=None).print(renderable)
    return out.getvalue()


def _rank(rank: int, host: str) -> RankComm:
    return RankComm(
        rank=rank, host=host, step_s=0.5, data_s=0.05, compute_s=0.3, optimizer_s=0.05, other_s=0.0,
        wait_s=0.05, comm_s=0.05, collectives_per_step=4, bytes_per_step=2e6, late_s=0.001, last_frac=0.5,
        clock_offset_s=0.0,
    )  # fmt: skip


def test_ranks_view_shows_hosts_ops_clock_and_source_as_text() -> None:
    analysis = RanksAnalysis(
        ranks=[_rank(0, f"node{HOSTILE}"), _rank(1, "[bold]plain")],
        matched=8, skew_s=0.001, straggler=None, straggler_last_frac=None, persistent=False,
        bandwidth=[OpBandwidth(f"all_reduce{HOSTILE}", 8, 2e6, 0.01, 10.0, 18.0)],
        clock=f"device{HOSTILE}",
    )  # fmt: skip
    scaling = Scaling(2, 1000.0, 600.0, f"runs/one{HOSTILE}.json", 0.83, {"comm": 0.1})
    d = SimpleNamespace(ranks_analysis=analysis, scaling=scaling, profile=SimpleNamespace(missing_ranks=[3]))
    text = _render(ranks_view.table(d))  # type: ignore[arg-type]
    assert "\x1b" not in text and "\x9b" not in text  # no escape code of the input reaches the terminal
    for where in ("node", "all_reduce", "device", "runs/one"):
        assert f"{where}[/a][red]x\\x1b]8;;https://e.example/\\x1b\\\\x1b[2J\\x9b1m" in text, where
    assert "[bold]plain" in text  # a markup-looking host is printed as written, not applied
    assert "missing: ranks 3 did not report" in text


def test_in_process_watch_prints_a_change_without_its_escape_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pitstop.integrations.watching import InProcessWatch
    from pitstop.wholerun.changes import Change
    from pitstop.wholerun.run import Event
    from pitstop.wholerun.windows import WindowSpec

    watch = InProcessWatch(WindowSpec(steps=10), trackers=[])
    change = Change(kind="new_finding", step=40, window=3, text=f"new: dataloader {HOSTILE}\nsecond line")
    watch._publish([Event(window=SimpleNamespace(), changes=[change])], rank=0)  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x9b" not in err
    assert err == (
        "pitstop watch: CHANGE (new_finding) new: dataloader "
        "[/a][red]x\\x1b]8;;https://e.example/\\x1b\\\\x1b[2J\\x9b1m\\nsecond line\n"
    )  # one line, the text as the job wrote it with its control characters shown as escapes


@pytest.mark.parametrize("missing", ["dask", "distributed"])
def test_dask_without_the_extra_is_one_line_from_the_python_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    from tests import kineto_ranks as kr

    from pitstop.errors import PitstopError
    from pitstop.ingest.load import Inputs, load_run
    from pitstop.ingest.trace import fleet

    folder = kr.write_folder(tmp_path / "t", kr.job(2))
    for name in [m for m in sys.modules if m.split(".")[0] in ("dask", "distributed")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, missing, None)  # the import fails as it would without the package
    read: list[str] = []
    monkeypatch.setattr(fleet, "summarize", lambda path, rank: read.append(path))  # nothing may be read
    for call in (
        lambda: fleet.read_traces(sorted(folder.iterdir()), jobs=1, dask="local"),
        lambda: load_run(Inputs(paths=[folder], dask="local")),
    ):
        with pytest.raises(PitstopError) as caught:
            call()
        message = str(caught.value)
        assert "\n" not in message and "pip install 'pitstop[dask]'" in message
        assert f"({missing} is not installed)" in message
    assert read == []
