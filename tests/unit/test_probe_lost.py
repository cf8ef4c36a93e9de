"""A rank whose probe disabled itself leaves a marker, and the runner ends the job with one line naming the
rank and the error (issue 40: doctor waited for a window that never came while the job trained on)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pitstop.probe.ending import LOST, leave_lost_marker, lost_probes
from pitstop.runner.collect import collect
from pitstop.runner.launch import Launch


def _lost(out: Path, pid: int, rank: int, ranks_here: int, error: str) -> None:
    (out / f"{LOST}{pid}").write_text(json.dumps({"rank": rank, "ranks_here": ranks_here, "error": error}))


def test_no_marker_no_loss(tmp_path: Path) -> None:
    assert lost_probes(tmp_path) is None
    (tmp_path / f"{LOST}7").write_text('{"rank": 0')  # cut short: not a rank's word
    assert lost_probes(tmp_path) is None


def test_the_probe_leaves_its_marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    leave_lost_marker(tmp_path, "RuntimeError: injected fault")
    lost = lost_probes(tmp_path)
    assert lost is not None and lost.ranks == [1] and lost.ranks_here == 2
    assert lost.error == "RuntimeError: injected fault" and lost.where == " on rank 1 of 2"
    leave_lost_marker(tmp_path / "missing", "x")  # a folder gone: never raises


def test_one_rank_says_no_rank_several_say_which(tmp_path: Path) -> None:
    _lost(tmp_path, 8, rank=0, ranks_here=1, error="TypeError: x")
    lost = lost_probes(tmp_path)
    assert lost is not None and lost.where == ""
    _lost(tmp_path, 9, rank=1, ranks_here=2, error="TypeError: y")
    lost = lost_probes(tmp_path)
    assert lost is not None and lost.where == " on every rank (0, 1)"


def test_collect_says_it_in_one_line(tmp_path: Path) -> None:
    _lost(tmp_path, 8, rank=1, ranks_here=4, error="RuntimeError: injected fault")
    stopped = Launch(["python", "train.py"], tmp_path, exit_code=0, probe_lost=lost_probes(tmp_path))
    outcome = collect(stopped, 10, 2)
    assert outcome.profile is None and outcome.exit_code == 1
    assert outcome.message == (
        "the probe failed on rank 1 of 4 in `python train.py`: RuntimeError: injected fault "
        "(pitstop stopped the job: no window would come)"
    )
    assert "\n" not in outcome.message
    ended = collect(
        Launch(["python", "train.py"], tmp_path, exit_code=0), 10, 2
    )  # ended before the runner saw
    assert ended.profile is None and ended.message is not None and "(the job ended)" in ended.message
