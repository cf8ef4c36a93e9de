"""The token cache under races, kills, changed settings and damage: nothing lost, nothing wrong.

Real processes throughout: concurrent builds of one cache, a build killed (SIGKILL) after every single
filesystem operation it makes and then resumed, ``pitstop data cache`` stopped by SIGINT / SIGTERM / SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tests.cache_inputs import number_rows, number_tokenizer
from tests.conftest import start_as_at_a_terminal

from pitstop.data import fsops
from pitstop.data.cache import build_cache, open_cache
from pitstop.data.errors import DataError
from pitstop.data.lock import BuildLock

pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text(number_rows(40))
    return path


@pytest.fixture
def tokenizer(tmp_path: Path) -> Path:
    return number_tokenizer(tmp_path / "tok")


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}


# -- 4. a resume with another shard size ------------------------------------------------------------------


@pytest.mark.slow
def test_resume_with_another_shard_size_keeps_every_example(
    data: Path, tokenizer: Path, tmp_path: Path
) -> None:
    out = tmp_path / "cache"
    seen: list[int] = []

    def stop_after_two(n: int) -> None:
        seen.append(n)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_cache(data, tokenizer, out, workers=1, shard_size=5, on_progress=stop_after_two)
    notes: list[str] = []
    path = build_cache(data, tokenizer, out, workers=1, shard_size=7, on_note=notes.append)  # another layout
    assert len(notes) == 1 and "other settings" in notes[0]
    reference = build_cache(data, tokenizer, tmp_path / "fresh", workers=1, shard_size=7)
    assert len(open_cache(path)) == 40
    assert _files(path) == _files(reference)


# -- 5. every array is checksummed ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mask.bin", "tokens.bin", "offsets.bin"])
def test_one_flipped_byte_in_any_array_is_caught(
    name: str, data: Path, tokenizer: Path, tmp_path: Path
) -> None:
    path = build_cache(data, tokenizer, tmp_path / "cache", workers=1)
    raw = bytearray((path / name).read_bytes())
    raw[len(raw) // 2 + 1] ^= 0x01
    (path / name).write_bytes(bytes(raw))
    with pytest.raises(DataError, match="damaged"):
        open_cache(path)  # loading (stats, pack, datasets) refuses it
    with pytest.raises(DataError, match="damaged"):
        open_cache(path, verify=False).verify()


@pytest.mark.parametrize(
    "change",
    [
        {"examples": "forty"},
        {"tokens": -3},
        {"token_dtype": "float128x"},
        {"layouts": ["alpaca"]},
        {"tokens_sha256": 12},
        {"checksums": {"tokens.bin": 12}},
        None,
    ],
)
@pytest.mark.slow
def test_a_meta_json_with_wrong_types_is_refused_in_one_line(
    change: dict[str, object] | None, data: Path, tokenizer: Path, tmp_path: Path
) -> None:
    path = build_cache(data, tokenizer, tmp_path / "cache", workers=1)
    meta = json.loads((path / "meta.json").read_text())
    if change is None:
        (path / "meta.json").write_text("{not json")
    else:
        meta.update(change)
        (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"meta\.json") as err:
        open_cache(path)
    assert "\n" not in str(err.value)


# -- 3. a kill after any filesystem operation, then a resume ----------------------------------------------


def _killed_build(k: int, data: Path, tokenizer: Path, out: Path) -> int:
    """Build in a forked child that SIGKILLs itself right after its k-th filesystem operation."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            fsops.count, fsops.kill_after = 0, k
            build_cache(data, tokenizer, out, workers=1, shard_size=15)
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="kills a forked build")
def test_a_kill_after_every_filesystem_operation_then_resumes_byte_identical(
    data: Path, tokenizer: Path, tmp_path: Path
) -> None:
    fsops.count = 0
    reference = build_cache(data, tokenizer, tmp_path / "reference", workers=1, shard_size=15)
    operations = fsops.count  # every one of them is a kill point below
    expected = _files(reference)
    assert operations >= 25  # lock, build.json, 3 shards, assembly, publishing, cleanup
    for k in range(1, operations + 1):
        out = tmp_path / f"killed-{k}"
        status = _killed_build(k, data, tokenizer, out)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"kill point {k} not reached"
        _killed_build(k, data, tokenizer, out)  # the resume is killed too (or ends, with fewer operations)
        path = build_cache(data, tokenizer, out, workers=1, shard_size=15)  # the resume
        assert _files(path) == expected, f"killed after operation {k}"
        assert [p.name for p in out.iterdir()] == [reference.name], f"leftovers after a kill at {k}"


# -- 2. two builds of one cache at once --------------------------------------------------------------------

_CLI_AT_GO = """
import sys, time
from pathlib import Path
from pitstop.cli.app import main
ready, go = Path(sys.argv[1]), Path(sys.argv[2])
sys.argv = ["pitstop", *sys.argv[3:]]
ready.touch()
while not go.exists():
    time.sleep(0.002)
main()
"""


@pytest.mark.slow
def test_concurrent_builds_of_one_cache_both_succeed_and_publish_it_whole(
    tokenizer: Path, tmp_path: Path
) -> None:
    data = tmp_path / "many.jsonl"
    data.write_text(number_rows(3000))
    reference = _files(build_cache(data, tokenizer, tmp_path / "reference", workers=1))
    for round_ in range(3):
        out, go = tmp_path / f"out-{round_}", tmp_path / f"go-{round_}"
        args = [
            "data",
            "cache",
            str(data),
            "--tokenizer",
            str(tokenizer),
            "--out",
            str(out),
            "--workers",
            "1",
        ]
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _CLI_AT_GO, str(tmp_path / f"ready-{round_}-{i}"), str(go), *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=_env(),
            )
            for i in range(2)
        ]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(
            (tmp_path / f"ready-{round_}-{i}").exists() for i in range(2)
        ):
            time.sleep(0.01)
        go.touch()  # both start building at the same moment
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=300)
            assert proc.returncode == 0, stderr
            assert "3,000 examples" in stdout
        (folder,) = [p for p in out.iterdir()]  # one cache, no partial build or lock left behind
        assert _files(folder) == reference


# -- 14. stopping `pitstop data cache` ---------------------------------------------------------------------


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads worker pids from /proc")
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "sigkill"])
def test_a_stopped_cache_build_ends_its_workers_quietly_and_says_what_it_kept(
    how: str, tokenizer: Path, tmp_path: Path
) -> None:
    data = tmp_path / "big.jsonl"
    data.write_text(number_rows(100_000))  # five shards of 20,000: far from done when the first one lands
    out = tmp_path / "cache"
    options = ["--out", str(out), "--workers", "2"]
    proc = start_as_at_a_terminal(
        [
            sys.executable,
            "-m",
            "pitstop",
            "data",
            "cache",
            str(data),
            "--tokenizer",
            str(tokenizer),
            *options,
        ],
        _env(),
        start_new_session=True,  # its own process group, as a terminal gives a foreground job
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not list(out.glob("*.partial/shard-*.bin")):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    workers = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    assert len(workers) == 2
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does: the whole group gets it
    else:
        os.kill(proc.pid, signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(_gone(w) for w in workers):
        time.sleep(0.05)
    assert all(_gone(w) for w in workers), "a tokenizer worker outlived pitstop"
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    shards = list(out.glob("*.partial/shard-*.bin"))
    assert shards  # what was finished is kept
    if how == "sigkill":
        assert proc.returncode == -signal.SIGKILL
        return
    assert proc.returncode == (130 if how == "ctrl-c" else 143)
    (line,) = [text for text in stderr.splitlines() if text.strip()]
    kept = f"{len(shards)} finished shard{'s' * (len(shards) != 1)} ({len(shards) * 20_000:,} examples)"
    assert line.startswith(f"pitstop: stopped by {'Ctrl-C' if how == 'ctrl-c' else 'SIGTERM'}: {kept}")
    assert ".partial" in line and "resumes" in line


# -- what a damaged cache or partial build turns into ------------------------------------------------------


@pytest.mark.slow
def test_a_broken_published_cache_is_rebuilt_by_the_next_build(
    data: Path, tokenizer: Path, tmp_path: Path
) -> None:
    out = tmp_path / "cache"
    path = build_cache(data, tokenizer, out, workers=1)
    expected = _files(path)
    for name in ("tokens.bin", "mask.bin", "offsets.bin"):  # what the old race left: meta.json alone
        (path / name).unlink()
    notes: list[str] = []
    assert build_cache(data, tokenizer, out, workers=1, on_note=notes.append) == path
    assert _files(path) == expected
    assert len(notes) == 1 and "tokens.bin is missing" in notes[0] and "building it again" in notes[0]


def _interrupted(data: Path, tokenizer: Path, out: Path) -> Path:
    seen: list[int] = []

    def stop_after_two(n: int) -> None:
        seen.append(n)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_cache(data, tokenizer, out, workers=1, shard_size=5, on_progress=stop_after_two)
    return next(out.glob("*.partial"))


@pytest.mark.slow
def test_a_damaged_shard_is_refused_then_redone(data: Path, tokenizer: Path, tmp_path: Path) -> None:
    partial = _interrupted(data, tokenizer, tmp_path / "cache")
    shard = partial / "shard-000001.bin"
    raw = bytearray(shard.read_bytes())
    raw[-3] ^= 0x01  # a flipped bit in its loss mask: the header still looks whole
    shard.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="damaged shard"):
        build_cache(data, tokenizer, tmp_path / "cache", workers=1, shard_size=5)
    assert not shard.exists()
    path = build_cache(data, tokenizer, tmp_path / "cache", workers=1, shard_size=5)
    assert _files(path) == _files(build_cache(data, tokenizer, tmp_path / "fresh", workers=1, shard_size=5))


@pytest.mark.slow
def test_shards_that_do_not_add_up_to_the_source_are_refused(
    data: Path, tokenizer: Path, tmp_path: Path
) -> None:
    partial = _interrupted(data, tokenizer, tmp_path / "cache")
    (partial / "shard-000099.bin").write_bytes((partial / "shard-000000.bin").read_bytes())
    with pytest.raises(DataError, match=r"shards hold 45 examples, .* has 40"):
        build_cache(data, tokenizer, tmp_path / "cache", workers=1, shard_size=5)
    assert len(open_cache(build_cache(data, tokenizer, tmp_path / "cache", workers=1, shard_size=5))) == 40


@pytest.mark.slow
def test_the_cli_refuses_a_bad_meta_json_in_one_line(data: Path, tokenizer: Path, tmp_path: Path) -> None:
    path = build_cache(data, tokenizer, tmp_path / "cache", workers=1)
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "examples": [40]}))
    for command in (["stats"], ["pack"]):
        proc = subprocess.run(
            [sys.executable, "-m", "pitstop", "data", *command, str(path)],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=120,
        )
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert "invalid meta.json (examples is [40], not a count)" in line and "internal error" not in line


@pytest.mark.slow
def test_a_build_waits_for_the_lock_holder_and_takes_over_a_dead_ones_lock(
    data: Path, tokenizer: Path, tmp_path: Path
) -> None:
    key = build_cache(data, tokenizer, tmp_path / "first", workers=1).name
    out = tmp_path / "cache"
    out.mkdir()
    notes: list[str] = []
    built: list[Path] = []
    with BuildLock(out / f"{key}.lock"):  # another build holds this cache
        worker = threading.Thread(
            target=lambda: built.append(build_cache(data, tokenizer, out, workers=1, on_note=notes.append))
        )
        worker.start()
        deadline = time.monotonic() + 120
        while not notes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not built  # it waits
    worker.join(120)
    assert notes == [f"pid {os.getpid()} is building this cache ({out / key}); waiting for it to finish"]
    assert built == [out / key] and [p.name for p in out.iterdir()] == [key]
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    other = tmp_path / "other"
    other.mkdir()
    (other / f"{key}.lock").write_text(dead.stdout)  # left by a build that was killed
    notes.clear()
    assert build_cache(data, tokenizer, other, workers=1, on_note=notes.append) == other / key
    assert notes == [] and [p.name for p in other.iterdir()] == [key]
