"""How the runner words a job's end and which code pitstop exits with, over rank files a dead job left."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from pitstop.core.profile import RankProfile, StepRecord, to_jsonable
from pitstop.probe.ending import MARKER, WAIT_FOR_RANKS_S, window_written
from pitstop.probe.rankfile import plain_step
from pitstop.probe.stream import RankStream
from pitstop.runner.collect import collect, death
from pitstop.runner.launch import Launch


def _job_with_steps(out: Path, steps: int, warmup: int = 2) -> None:
    stream = RankStream(out)
    stream.write("start", rank=0, local_rank=0, pid=1, warmup=warmup)
    for i in range(1, steps + 1):
        stream.write("step", step=plain_step(StepRecord(index=i, wall_s=0.1, tokens=64, real_tokens=64)), t=i)
    stream.close()
    (out / "armed-1").write_text("python train.py")


@pytest.mark.parametrize(
    ("returncode", "code", "words"),
    [
        (-9, 137, "the job was killed by SIGKILL (the OOM killer's way) after 8 measured steps"),
        (-11, 139, "the job was killed by SIGSEGV (a crash in native code) after 8 measured steps"),
        (-15, 143, "the job was killed by SIGTERM (asked to stop"),
        (137, 137, "the job exited with code 137 (a death by SIGKILL as a shell reports it"),
    ],
)
def test_a_death_by_signal_keeps_the_steps_and_says_so(
    tmp_path: Path, returncode: int, code: int, words: str
) -> None:
    _job_with_steps(tmp_path, 10)
    outcome = collect(Launch(["python", "train.py"], tmp_path, exit_code=returncode), 50, 2)
    assert outcome.profile is not None and outcome.exit_code == code
    assert outcome.message is not None and outcome.message.startswith(words)
    assert [len(r.steps) for r in outcome.profile.ranks] == [8]
    assert outcome.profile.exit_code == code and outcome.message in outcome.profile.notes


def test_what_pitstop_stopped_is_told_by_what_stopped_it(tmp_path: Path) -> None:
    _job_with_steps(tmp_path, 10)
    ctrl_c = collect(Launch(["x"], tmp_path, exit_code=1, interrupted=True, stopped_by="SIGINT"), None, 2)
    assert ctrl_c.exit_code == 130 and ctrl_c.message is not None and "Ctrl-C" in ctrl_c.message
    term = collect(Launch(["x"], tmp_path, exit_code=1, interrupted=True, stopped_by="SIGTERM"), None, 2)
    assert term.exit_code == 143 and term.message is not None
    assert "pitstop got SIGTERM" in term.message and "Ctrl-C" not in term.message
    forced = Launch(["x"], tmp_path, exit_code=-9, interrupted=True, stopped_by="SIGINT", forced=True)
    out = collect(forced, None, 2)
    assert out.exit_code == 130 and out.message is not None
    assert (
        "did not end on SIGINT or SIGTERM, and was killed with SIGKILL after 8 measured steps" in out.message
    )
    late = Launch(["x"], tmp_path, exit_code=-9, interrupted=True, stopped_by="timeout", forced=True)
    out = collect(late, None, 2)
    assert out.exit_code == 130 and out.message is not None
    assert out.message.startswith("the job was stopped at its --timeout, did not end within 10 s of SIGINT")


def test_a_death_before_any_step(tmp_path: Path) -> None:
    (tmp_path / "armed-1").write_text("python train.py")
    outcome = collect(Launch(["python", "train.py"], tmp_path, exit_code=-11), 50, 2)
    assert outcome.profile is None and outcome.exit_code == 139
    assert (
        outcome.message
        == "`python train.py` was killed by SIGSEGV (a crash in native code) before its first optimizer step"
    )


def test_a_clean_exit_is_no_death(tmp_path: Path) -> None:
    assert death(Launch(["x"], tmp_path, exit_code=0)) == (None, 0)
    assert death(Launch(["x"], tmp_path, exit_code=3)) == ("exited with code 3", 3)


def _marker(out: Path, pid: int, rank: int, ranks_here: int, age_s: float = 0.0) -> None:
    path = out / f"{MARKER}{pid}"
    path.write_text(json.dumps({"rank": rank, "ranks_here": ranks_here}))
    if age_s:
        os.utime(path, (time.time() - age_s, time.time() - age_s))


def test_the_job_is_stopped_once_every_rank_of_the_node_wrote_its_window(tmp_path: Path) -> None:
    assert not window_written(tmp_path)
    (tmp_path / f"{MARKER}7").write_text('{"rank": 0')  # unreadable: not a rank's word
    _marker(tmp_path, 8, rank=0, ranks_here=2)
    assert not window_written(tmp_path)  # rank 1 is still writing its rank file
    _marker(tmp_path, 9, rank=1, ranks_here=2)
    assert window_written(tmp_path)


def test_a_rank_that_never_writes_its_window_does_not_hold_the_job_forever(tmp_path: Path) -> None:
    _marker(tmp_path, 8, rank=0, ranks_here=2, age_s=WAIT_FOR_RANKS_S + 1)
    assert window_written(tmp_path)


def test_a_job_stopped_after_its_window_is_a_success(tmp_path: Path) -> None:
    stream = RankStream(tmp_path)
    stream.write("start", rank=0, local_rank=0, pid=1, warmup=2)
    records = [StepRecord(index=i, wall_s=0.1, tokens=64, real_tokens=64) for i in range(1, 9)]
    profile = RankProfile(rank=0, warmup_steps=2, steps=records[2:], stopped_by_probe=True)
    stream.write("profile", profile=to_jsonable(profile))
    stream.close()
    # as run_observed leaves it: the job ended on pitstop's SIGINT (KeyboardInterrupt: -2)
    launch = Launch(["x"], tmp_path, exit_code=0, ended_after_window=True, job_exit_code=-2)
    outcome = collect(launch, 6, 2)
    assert outcome.exit_code == 0 and outcome.message is None
    assert outcome.profile is not None and outcome.profile.exit_code == 0
    assert not any("interrupted" in note or "killed" in note for note in outcome.profile.notes)
