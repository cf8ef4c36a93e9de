"""Issue 25's leftovers: the last places an untrusted string reached the terminal as markup or escape codes,
the dask extra named from the Python API, the data layer's files checked to be regular files before the
open, and ``pitstop plan`` bounding its numbers. Nothing here starts a process; every FIFO is made in the
test's own temporary folder, and every read that could block runs under a watchdog."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console
from tests.unit.test_special_files import within

from pitstop.data.cache import CACHE_FORMAT
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
    from pitstop.trace import fleet

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


# -- the data layer's files are regular files, checked before the open ------------------------------------


def _hand_made_cache(folder: Path) -> Path:
    """A valid two-example cache written directly (a build starts worker processes)."""
    import hashlib
    import zlib

    import numpy as np

    folder.mkdir(parents=True)
    arrays = {
        "tokens.bin": np.array([5, 6, 7, 8, 9], dtype=np.uint16).tobytes(),
        "mask.bin": np.array([0, 1, 0, 1, 1], dtype=np.uint8).tobytes(),
        "offsets.bin": np.array([0, 2, 5], dtype=np.int64).tobytes(),
    }
    for name, data in arrays.items():
        (folder / name).write_bytes(data)
    sums = {n: {"crc32": zlib.crc32(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in arrays.items()}
    meta = {
        "format": CACHE_FORMAT, "key": folder.name, "examples": 2, "tokens": 5, "trained_tokens": 3,
        "token_dtype": "uint16", "source": "train.jsonl", "tokenizer": "tok.json", "tokenizer_fingerprint": "x",
        "template": "plain", "skipped": 0, "layouts": {"text": 2}, "checksums": sums,
    }  # fmt: skip
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def _one_line_data_error(action: Any, *names: str) -> str:
    """The DataError ``action`` raises under the watchdog: one line naming what it should."""
    from pitstop.data.errors import DataError

    with pytest.raises(DataError) as caught:
        within(10, action)
    message = str(caught.value)
    assert "\n" not in message
    for name in names:
        assert name in message, (name, message)
    return message


def test_a_fifo_meta_json_is_one_line_not_a_hang(tmp_path: Path) -> None:
    from pitstop.data.cache import _read_meta, open_cache

    cache = _hand_made_cache(tmp_path / "cache" / "k1")
    assert len(open_cache(cache)) == 2  # the hand-made cache is valid
    (cache / "meta.json").unlink()
    os.mkfifo(cache / "meta.json")
    # was: "no complete pitstop cache" from open_cache, and a read blocked forever in _read_meta
    _one_line_data_error(
        lambda: open_cache(cache), "meta.json: a FIFO (named pipe), not a file pitstop reads"
    )
    _one_line_data_error(lambda: _read_meta(cache), "meta.json: a FIFO (named pipe)")


@pytest.mark.parametrize("name", ["tokens.bin", "mask.bin", "offsets.bin"])
def test_a_fifo_in_place_of_an_array_is_a_damaged_cache(tmp_path: Path, name: str) -> None:
    from pitstop.data.cache import TokenCache, _read_meta, open_cache

    cache = _hand_made_cache(tmp_path / "k1")
    meta = _read_meta(cache)
    (cache / name).unlink()
    os.mkfifo(cache / name)
    _one_line_data_error(lambda: open_cache(cache), f"{name}: a FIFO (named pipe)", "a damaged cache")
    _one_line_data_error(lambda: TokenCache(cache, meta), f"{name}: a FIFO (named pipe)")


def test_a_fifo_as_the_data_or_the_tokenizer_is_one_line(tmp_path: Path) -> None:
    from pitstop.data.cache import build_cache
    from pitstop.data.examples import read_examples
    from pitstop.data.tokenize import describe_tokenizer

    data = tmp_path / "train.jsonl"
    os.mkfifo(data)
    _one_line_data_error(lambda: list(read_examples(data)), "train.jsonl: a FIFO (named pipe)")
    # refused before the tokenizer is looked at or the source hashed (the hash read blocked forever)
    _one_line_data_error(
        lambda: build_cache(data, tmp_path / "none", tmp_path / "out"), "train.jsonl: a FIFO"
    )
    tok = tmp_path / "tok"
    tok.mkdir()
    os.mkfifo(tok / "tokenizer.json")
    _one_line_data_error(lambda: describe_tokenizer(tok), "tokenizer.json: a FIFO (named pipe)")
    (tok / "tokenizer.json").unlink()
    (tok / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}, "added_tokens": []}')
    os.mkfifo(tok / "tokenizer_config.json")  # was skipped silently (its template and special tokens lost)
    _one_line_data_error(lambda: describe_tokenizer(tok), "tokenizer_config.json: a FIFO (named pipe)")
    assert not (tmp_path / "out").exists()


def test_a_fifo_shard_is_remade_and_a_fifo_lock_refused(tmp_path: Path) -> None:
    from pitstop.data.cache import _kept, _shard_head
    from pitstop.data.lock import BuildLock

    partial = tmp_path / "k1.partial"
    partial.mkdir()
    os.mkfifo(partial / "shard-000000.bin")
    assert within(10, lambda: _shard_head(partial / "shard-000000.bin")) is None  # not whole: made again
    assert within(10, lambda: _kept(partial)) == (0, 0)
    lock = tmp_path / "k1.lock"
    os.mkfifo(lock)

    def take() -> None:
        with BuildLock(lock):
            pass

    _one_line_data_error(take, "k1.lock: a FIFO (named pipe)", "remove it")


# -- pitstop plan bounds its counts ---------------------------------------------------------------------------

HUGE = "99999999999999999999999"  # 23 digits


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--seq", "12345678901234567890123"], "--seq 123456789012… (23 digits): from 1 to 33,554,432"),
        (["--micro-batch", HUGE], "--micro-batch 999999999999… (23 digits): from 1 to 1,048,576"),
        (["--gpus", HUGE], "--gpus 999999999999… (23 digits): from 1 to 1,048,576"),
        (["--global-batch", HUGE], "--global-batch 999999999999… (23 digits): from 1 to 4,294,967,296"),
        (["--micro-batch", "auto", "--global-batch", HUGE], "--global-batch 999999999999…"),
        (["--rank", "99999999999999999999", "--method", "lora"], "--rank 999999999999… (20 digits)"),
        (["--nodes", "9999999999999"], "--nodes 9999999999999: from 1 to 1,048,576"),
        (["--micro-batch", "²"], "--micro-batch is a number or auto"),  # was ValueError from int()
    ],
)
def test_plan_refuses_absurd_counts_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, args: list[str], expected: str
) -> None:
    from tests.inprocess import cli

    code, out, err = cli(capsys, monkeypatch, "plan", "--model", "smollm2-135m", "--no-simulate", *args)
    assert code == 2 and out == ""
    assert err.startswith("pitstop: ") and err.count("\n") == 1 and expected in err, err


def test_plan_api_bounds_and_no_simulation_past_torchs_sizes() -> None:
    from pitstop.plan.build import LIMITS, PlanRequest, _cross_check, build_plan
    from pitstop.plan.planner import PlanError

    with pytest.raises(PlanError, match=r"--seq 100000000000… \(23 digits\)"):
        build_plan(PlanRequest(model="smollm2-135m", seq=10**22, simulate=False))
    with pytest.raises(PlanError, match="--gpus 0: from 1"):
        build_plan(PlanRequest(model="smollm2-135m", gpus=0, simulate=False))
    with pytest.raises(PlanError, match="--seq is a whole number"):
        build_plan(PlanRequest(model="smollm2-135m", seq=2048.5, simulate=False))  # type: ignore[arg-type]
    # at the bounds themselves torch's sizes would overflow (and torch logs a traceback): no simulation
    setup = SimpleNamespace(
        micro_batch=LIMITS["micro_batch"][1], seq=LIMITS["seq"][1]
    )  # the plan's, as sized
    plan = SimpleNamespace(setup=setup, notes=[])
    request = PlanRequest(model="smollm2-135m", seq=LIMITS["seq"][1], simulate=True)
    _cross_check(plan, {}, request)  # type: ignore[arg-type]
    assert plan.notes == [
        "not simulated on fake tensors: 35,184,372,088,832 tokens per micro-batch is past the 4,294,967,296 "
        "a simulation covers; the figures are the formula's"
    ]
