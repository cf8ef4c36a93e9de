"""The run history: where it lives, what it fingerprints, what it refuses to touch, and many writers at once."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from tests.factories import profile, steps

from pitstop import schemas
from pitstop.diagnose import diagnose
from pitstop.history import (
    APPLICATION_ID,
    HistoryError,
    check,
    default_path,
    find_baseline,
    fingerprint,
    fingerprint_diff,
    fingerprint_fields,
    git_head,
    metric_rows,
    open_store,
    parse_max_drop,
    record,
    resolve_label,
    slowdown,
)
from pitstop.history.fingerprint import canonical_json, sequence_length
from pitstop.history.paths import project_file_name
from pitstop.remedies.pin_versions import minor_version

VERSIONS = {"torch": "2.5.1+cu124", "transformers": "4.46.3", "accelerate": "1.1.0"}
COMMAND = ["python", "train.py", "--lr", "2e-5"]


def run_doc(
    wall: float = 0.15, row_len: int = 1024, versions: dict[str, str] | None = None, **env: Any
) -> dict[str, Any]:
    """A real ``pitstop.run/1`` document: a hand-made H100 profile through ``diagnose``."""
    prof = profile(
        "cuda",
        steps(wall=wall, data=0.001, real_frac=0.99, row_len=row_len),
        util=97.0,
        versions=dict(VERSIONS if versions is None else versions),
        **env,
    )
    prof.command = list(COMMAND)
    return diagnose(prof).to_dict()


def tune_doc(baseline_run: dict[str, Any], best_tps: float | None) -> dict[str, Any]:
    base = baseline_run["metrics"]["real_tokens_per_s"]
    best = None
    if best_tps is not None:
        best = {
            "fixes": ["padding_waste"],
            "real_tokens_per_s": best_tps,
            "speedup": best_tps / base,
            "changes": ["packing=True"],
        }
    return {
        "schema": "pitstop.tune/1",
        "baseline": {"real_tokens_per_s": base * 0.99, "spread": 0.01},
        "best": best,
        "baseline_run": baseline_run,
    }


def snapshot(path: Path) -> tuple[bytes, int, list[str]]:
    siblings = sorted(p.name for p in path.parent.iterdir())
    return path.read_bytes(), path.stat().st_mtime_ns, siblings


# -- where the history lives ---------------------------------------------------------------------------


def test_tests_never_write_into_home(history_file: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    assert default_path() == history_file
    assert history_file.parent.parent == tmp_path_factory.getbasetemp()


def test_location_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv("PITSTOP_HISTORY")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    project = tmp_path / "proj"
    (project / ".git").mkdir(parents=True)
    monkeypatch.chdir(project)
    own = project_file_name(project.resolve())
    assert default_path() == tmp_path / "home" / ".local" / "share" / "pitstop" / "history" / own
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
    assert default_path() == tmp_path / "home" / ".local" / "share" / "pitstop" / "history" / own
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "xdg" / "pitstop" / "history" / own
    monkeypatch.setenv("PITSTOP_HISTORY", str(tmp_path / "env.sqlite3"))
    assert default_path() == tmp_path / "env.sqlite3"
    explicit = tmp_path / "deep" / "er" / "h.sqlite3"
    run_id = record(run_doc(), "doctor", path=explicit, label="x")
    assert run_id == 1 and explicit.is_file() and not (tmp_path / "env.sqlite3").exists()


def test_macos_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.delenv("PITSTOP_HISTORY")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    folder = tmp_path / "Library" / "Application Support" / "pitstop" / "history"
    assert default_path().parent == folder


# -- fingerprints ----------------------------------------------------------------------------------------


def test_fingerprint_fields_of_a_real_document() -> None:
    fields = fingerprint_fields(run_doc())
    assert fields == {
        "model_type": "llama",
        "params_total": 1_235_814_400,
        "n_layers": 16,
        "hidden_size": 2048,
        "device": "cuda",
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "gpu_count": 1,
        "world_size": 1,
        "seq_len": 1024,
        "micro_batch_size": 8,
        "grad_accum_steps": 1,
    }
    expected = hashlib.sha256(canonical_json(fields).encode()).hexdigest()[:12]
    assert fingerprint(run_doc()) == expected and len(expected) == 12


def test_fingerprint_keeps_one_history_across_noise_and_fixes() -> None:
    base = fingerprint(run_doc())
    assert fingerprint(run_doc(wall=0.3)) == base  # slower: same setup, a regression to catch
    assert fingerprint(run_doc(row_len=1000)) == base  # padded-to-longest mean moves a little
    assert fingerprint(run_doc(versions={**VERSIONS, "torch": "2.5.0"})) == base  # patch release
    # an upgrade keeps the run next to its baseline, so a regression it brought is seen (library_upgrade)
    assert fingerprint(run_doc(versions={**VERSIONS, "torch": "2.6.0"})) == base
    assert fingerprint(run_doc(versions={k: v for k, v in VERSIONS.items() if k != "accelerate"})) == base
    assert fingerprint(run_doc(param_dtype="fp32", tf32=False)) == base  # what a fix changes stays out


@pytest.mark.parametrize(
    "change",
    [
        {"row_len": 4096},
        {"micro_batch_size": 16},
        {"grad_accum_steps": 4},
        {"gpu_name": "NVIDIA A100-SXM4-80GB"},
        {"gpu_count": 8},
        {"world_size": 8},
    ],
)
def test_fingerprint_splits_on_a_different_setup(change: dict[str, Any]) -> None:
    assert fingerprint(run_doc(**change)) != fingerprint(run_doc())


def test_configured_max_length_wins_over_the_measured_mean() -> None:
    doc = run_doc(row_len=700, max_seq_len=2048)
    assert sequence_length(doc) == 2048
    assert sequence_length(run_doc(row_len=700)) == 1024
    assert sequence_length({"metrics": {"seq_len": None}}) is None


@pytest.mark.parametrize(
    ("raw", "minor"),
    [("2.5.1+cu124", "2.5"), ("4.46.0.dev0", "4.46"), ("1.0", "1.0"), ("nightly", "nightly")],
)
def test_minor_version(raw: str, minor: str) -> None:
    assert minor_version(raw) == minor


# -- recording ---------------------------------------------------------------------------------------------


def test_record_a_run_document(history_file: Path) -> None:
    doc = run_doc()
    run_id = record(doc, "doctor", label="baseline")
    with open_store() as store:
        stored = store.get(run_id)
    assert stored is not None
    assert stored.kind == "doctor" and stored.label == "baseline"
    assert stored.command == "python train.py --lr 2e-5"
    assert stored.fingerprint == fingerprint(doc)
    assert stored.fingerprint_fields == fingerprint_fields(doc)
    assert stored.real_tokens_per_s == pytest.approx(doc["metrics"]["real_tokens_per_s"])
    assert stored.tokens_per_s == pytest.approx(doc["metrics"]["tokens_per_s"])
    assert stored.step_time_s == pytest.approx(0.15)
    assert stored.mfu == pytest.approx(doc["metrics"]["mfu"])
    assert stored.result == json.loads(json.dumps(doc))
    created = datetime.fromisoformat(stored.created_at)
    assert created.utcoffset() == timezone.utc.utcoffset(None)
    assert abs((datetime.now(timezone.utc) - created).total_seconds()) < 60
    conn = sqlite3.connect(history_file)
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert conn.execute("PRAGMA user_version").fetchone()[0] == schemas.HISTORY_DB_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    indexes = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'index'").fetchall()
    assert any("(fingerprint, label, id)" in sql for (sql,) in indexes)
    conn.close()


def test_record_a_tune_document_takes_the_best_throughput() -> None:
    baseline_run = run_doc()
    base_tps = baseline_run["metrics"]["real_tokens_per_s"]
    run_id = record(tune_doc(baseline_run, best_tps=base_tps * 1.4), "tune", label="main")
    with open_store() as store:
        stored = store.get(run_id)
    assert stored is not None
    assert stored.real_tokens_per_s == pytest.approx(base_tps * 1.4)
    assert stored.fingerprint == fingerprint(baseline_run)
    assert stored.command == "python train.py --lr 2e-5"
    assert (stored.tokens_per_s, stored.step_time_s, stored.mfu) == (
        None,
        None,
        None,
    )  # measured for the baseline only
    assert stored.result is not None and stored.result["best"]["fixes"] == ["padding_waste"]


def test_record_a_tune_document_without_a_better_fix_takes_the_baseline() -> None:
    baseline_run = run_doc()
    run_id = record(tune_doc(baseline_run, best_tps=None), "tune", label="main")
    with open_store() as store:
        stored = store.get(run_id)
    assert stored is not None
    assert stored.real_tokens_per_s == pytest.approx(baseline_run["metrics"]["real_tokens_per_s"] * 0.99)
    assert stored.step_time_s == pytest.approx(0.15)
    assert stored.mfu == pytest.approx(baseline_run["metrics"]["mfu"])


@pytest.mark.parametrize(
    "bad",
    [
        {"schema": "pitstop.plan/1"},
        {"schema": "pitstop.tune/1", "baseline": {}, "best": None},
        {"findings": []},
        ["not", "a", "dict"],
    ],
)
def test_record_refuses_other_documents(bad: Any, history_file: Path) -> None:
    with pytest.raises(HistoryError, match="pitstop"):
        record(bad, "doctor")
    assert not history_file.exists()


def test_list_get_latest_filter_and_order() -> None:
    ids = [
        record(run_doc(), "doctor", label="main"),
        record(run_doc(wall=0.2), "doctor", label="feature"),
        record(tune_doc(run_doc(), 60_000.0), "tune", label="main"),
        record(run_doc(row_len=4096), "doctor", label="main"),
    ]
    assert ids == [1, 2, 3, 4]
    with open_store() as store:
        assert [r.id for r in store.list()] == [4, 3, 2, 1]
        assert [r.id for r in store.list(limit=2)] == [4, 3]
        assert [r.id for r in store.list(kind="doctor", label="main")] == [4, 1]
        assert all(r.result is None for r in store.list())  # the list stays light
        assert store.get(99) is None
        latest = store.latest(label="main", fingerprint=fingerprint(run_doc()), exclude=3)
        assert latest is not None and latest.id == 1 and latest.result is not None
        assert store.latest(kind="analyze") is None
        assert store.count() == 4


def test_reading_a_missing_history_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "nothing" / "h.sqlite3"
    with open_store(path, create=False) as store:
        assert store.list() == [] and store.get(1) is None and store.latest() is None
    assert not path.parent.exists()
    with pytest.raises(HistoryError, match="reading only"), open_store(path, create=False) as store:
        store.add(run_doc(), "doctor")


# -- labels ------------------------------------------------------------------------------------------------

SHA = "0123456789abcdef0123456789abcdef01234567"


def fake_checkout(root: Path, head: str, refs: dict[str, str] | None = None, packed: str = "") -> Path:
    git = root / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text(head + "\n")
    for ref, sha in (refs or {}).items():
        (git / ref).parent.mkdir(parents=True, exist_ok=True)
        (git / ref).write_text(sha + "\n")
    if packed:
        (git / "packed-refs").write_text(packed)
    return root


def test_label_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = fake_checkout(tmp_path / "repo", "ref: refs/heads/feature/fast", {"refs/heads/feature/fast": SHA})
    sub = repo / "src" / "pkg"
    sub.mkdir(parents=True)
    monkeypatch.delenv("PITSTOP_LABEL", raising=False)
    assert git_head(sub) == ("feature/fast", SHA)
    assert resolve_label(None, sub) == "feature/fast"
    monkeypatch.setenv("PITSTOP_LABEL", "nightly")
    assert resolve_label(None, sub) == "nightly"
    assert resolve_label("pr-42", sub) == "pr-42"
    monkeypatch.delenv("PITSTOP_LABEL")
    outside = tmp_path / "plain"
    outside.mkdir()
    assert git_head(outside) == (None, None) and resolve_label(None, outside) is None


def test_record_labels_with_the_branch_of_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = fake_checkout(tmp_path, "ref: refs/heads/main", packed=f"# pack-refs\n{SHA} refs/heads/main\n")
    monkeypatch.chdir(repo)
    monkeypatch.delenv("PITSTOP_LABEL", raising=False)
    with open_store() as store:
        stored = store.get(record(run_doc(), "doctor"))
    assert stored is not None and (stored.label, stored.git_commit) == ("main", SHA)


def test_detached_head_and_worktree(tmp_path: Path) -> None:
    assert git_head(fake_checkout(tmp_path / "detached", SHA)) == (None, SHA)
    main = fake_checkout(tmp_path / "main", "ref: refs/heads/main", {"refs/heads/topic": SHA})
    wt_git = main / ".git" / "worktrees" / "wt"
    wt_git.mkdir(parents=True)
    (wt_git / "HEAD").write_text("ref: refs/heads/topic\n")
    (wt_git / "commondir").write_text("../..\n")
    worktree = tmp_path / "wt"
    worktree.mkdir()
    (worktree / ".git").write_text(f"gitdir: {wt_git}\n")
    assert git_head(worktree) == ("topic", SHA)


# -- safety: refuse what is not ours, and never touch it ----------------------------------------------------


def _valid_history(path: Path, runs: int = 6) -> None:
    for _ in range(runs):
        record(run_doc(), "doctor", path=path, label="x")


def _text(path: Path) -> None:
    path.write_text("wandb: run summary\nloss 1.23\n" * 20)


def _short_header(path: Path) -> None:
    path.write_bytes(b"SQLite format 3\x00" + b"\x10\x00" * 10)


def _truncated(path: Path) -> None:
    _valid_history(path)
    data = path.read_bytes()
    assert len(data) > 8192
    path.write_bytes(data[: len(data) // 2])


def _garbage_after_magic(path: Path) -> None:
    path.write_bytes(b"SQLite format 3\x00" + os.urandom(4096))


def _foreign(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE cookies (host TEXT, value TEXT)")
    conn.execute("INSERT INTO cookies VALUES ('example.org', 'x')")
    conn.commit()
    conn.close()


def _foreign_app_id(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA application_id = 1234")
    conn.close()


def _newer(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, future TEXT)")
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {schemas.HISTORY_DB_VERSION + 1}")
    conn.commit()
    conn.close()


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (_text, "not an SQLite database"),
        (_short_header, "not an SQLite database"),
        (_truncated, "truncated"),
        (_garbage_after_magic, "another program|truncated"),
        (_foreign, "another program"),
        (_foreign_app_id, "another program"),
        (_newer, "newer pitstop"),
    ],
)
def test_unusable_files_are_refused_and_left_untouched(make: Any, says: str, tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite3"
    make(path)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))  # so a write would show in mtime too
    before = snapshot(path)
    with pytest.raises(HistoryError, match=says) as err:
        record(run_doc(), "doctor", path=path)
    with pytest.raises(HistoryError, match=says), open_store(path, create=False) as store:
        store.list()
    message = str(err.value)
    assert isinstance(err.value, ValueError)
    assert str(path) in message and "\n" not in message
    assert snapshot(path) == before


def test_an_empty_file_becomes_a_history(tmp_path: Path) -> None:
    path = tmp_path / "empty.sqlite3"
    path.touch()
    assert record(run_doc(), "doctor", path=path) == 1
    with open_store(path) as store:
        assert store.count() == 1


def test_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match="folder"):
        record(run_doc(), "doctor", path=tmp_path)


# -- many writers at once ----------------------------------------------------------------------------------

_WRITER = """
import json, sys, time
from pathlib import Path
from pitstop.history import record
path, doc_file, rank, n, ready, go = sys.argv[1:]
doc = json.loads(Path(doc_file).read_text())
Path(ready).touch()
while not Path(go).exists():
    time.sleep(0.005)
ids = [record(doc, "doctor", path=Path(path), label=f"rank-{rank}") for _ in range(int(n))]
print(json.dumps(ids))
"""


@pytest.mark.slow
def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "not" / "yet" / "history.sqlite3"  # the writers also race to create it
    doc_file = tmp_path / "doc.json"
    doc_file.write_text(json.dumps(run_doc()))
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _WRITER,
                str(path),
                str(doc_file),
                str(rank),
                "25",
                str(tmp_path / f"ready{rank}"),
                str(go),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(8)
    ]
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"ready{r}").exists() for r in range(8)) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()  # all eight start writing at the same moment
    returned: list[int] = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        returned += json.loads(out)
    assert len(returned) == len(set(returned)) == 200
    with open_store(path) as store:
        runs = store.list(limit=None)
        assert sorted(r.id for r in runs) == sorted(returned)
        for rank in range(8):
            assert len(store.list(limit=None, label=f"rank-{rank}")) == 25


# -- compare and check (pure) ------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "value"), [("5%", 0.05), ("0.05", 0.05), (" 12.5 %", 0.125), ("0", 0.0)])
def test_parse_max_drop(text: str, value: float) -> None:
    assert parse_max_drop(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["abc", "5", "-1%", "100%", "nan", ""])
def test_parse_max_drop_refuses(text: str) -> None:
    with pytest.raises(HistoryError, match="--max-drop"):
        parse_max_drop(text)


def test_slowdown_means_the_same_for_speeds_and_times() -> None:
    assert slowdown(100.0, 90.0, "real_tokens_per_s") == pytest.approx(0.10)
    assert slowdown(100.0, 110.0, "real_tokens_per_s") == pytest.approx(-0.10)
    assert slowdown(0.1, 0.1 / 0.9, "step_time_s") == pytest.approx(0.10)  # 10% fewer steps per second


def test_fingerprint_diff_names_nested_fields() -> None:
    a = fingerprint_fields(run_doc())
    b = fingerprint_fields(run_doc(versions={**VERSIONS, "torch": "2.6.1"}, micro_batch_size=4))
    assert fingerprint_diff(a, b) == {"micro_batch_size": (8, 4)}  # versions: compared apart
    assert fingerprint_diff(a, a) == {}


def test_check_and_metric_rows() -> None:
    fast = record(run_doc(wall=0.10), "doctor", label="main")
    slow = record(run_doc(wall=0.12), "doctor", label="pr")
    with open_store() as store:
        base, run = store.get(fast), store.get(slow)
    assert base is not None and run is not None
    rows = {r.name: r for r in metric_rows(base, run)}
    assert rows["real_tokens_per_s"].ratio == pytest.approx(0.10 / 0.12)
    assert rows["step_time_s"].ratio == pytest.approx(1.2)
    verdict = check(run, base, "real_tokens_per_s", 0.05)
    assert verdict.regression and verdict.drop == pytest.approx(1 - 0.10 / 0.12)
    assert "16.7% slower" in verdict.message() and "#1 (main)" in verdict.message()
    assert not check(run, base, "real_tokens_per_s", 0.20).regression
    assert check(run, base, "step_time_s", 0.05).drop == pytest.approx(1 - 0.10 / 0.12)
    assert not check(base, run, "real_tokens_per_s", 0.0).regression  # faster is never a regression
    with pytest.raises(HistoryError, match="own baseline"):
        check(run, run, "mfu", 0.05)
    with pytest.raises(HistoryError, match="unknown metric"):
        check(run, base, "loss", 0.05)


def test_find_baseline_by_label_and_setup_or_by_id() -> None:
    main_old = record(run_doc(), "doctor", label="main")
    record(run_doc(row_len=4096), "doctor", label="main")  # another setup: never a baseline for 1k runs
    main_new = record(run_doc(), "doctor", label="main")
    record(tune_doc(run_doc(), 90_000.0), "tune", label="main")  # another kind
    pr = record(run_doc(wall=0.2), "doctor", label="pr")
    with open_store() as store:
        run = store.get(pr)
        assert run is not None
        assert find_baseline(store, run, "main").id == main_new
        assert find_baseline(store, run, str(main_old)).id == main_old
        assert find_baseline(store, run, f"#{main_old}").id == main_old
        with pytest.raises(HistoryError, match="no doctor run labelled 'pr'"):
            find_baseline(store, run, "pr")  # the run itself is excluded
        with pytest.raises(HistoryError, match="no run #77"):
            find_baseline(store, run, "77")


# -- damage inside a valid-looking file, read-only places, damaged rows -------------------------------------


def _corrupt_a_cell_pointer(path: Path) -> None:
    """Flip one byte of a b-tree page's cell pointers: the header stays valid, SQLite's quick_check fails."""
    data = path.read_bytes()
    page = int.from_bytes(data[16:18], "big")
    for number in range(2, len(data) // page):
        bad = bytearray(data)
        bad[number * page + 8] ^= 0xFF
        path.write_bytes(bytes(bad))
        conn = sqlite3.connect(path)
        try:
            damaged = conn.execute("PRAGMA quick_check").fetchall() != [("ok",)]
        except sqlite3.DatabaseError:
            damaged = False  # refused already by the old code: not the case this test is about
        finally:
            conn.close()
        if damaged:
            return
    pytest.fail("no page whose damage only quick_check sees")


def test_a_history_that_fails_the_integrity_check_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite3"
    _valid_history(path, runs=30)
    _corrupt_a_cell_pointer(path)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    before = snapshot(path)
    with pytest.raises(HistoryError, match="integrity check") as err:
        record(run_doc(), "doctor", path=path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(HistoryError, match="integrity check"), open_store(path, create=False) as store:
        store.list()
    assert snapshot(path) == before


_READER = """
import json, sys
from pitstop.history import open_store
with open_store(sys.argv[1], create=False) as store:
    print(json.dumps(sorted(r.id for r in store.list(limit=None))))
"""

_CRASHED_WRITER = """
import json, os, sys
from pitstop.history import open_store
store = open_store(sys.argv[1])
store.add(json.loads(open(sys.argv[2]).read()), "doctor")
os._exit(0)  # no close, no checkpoint: the last runs live only in the -wal file
"""


def _read_on_a_read_only_disk(
    folder: Path, path: Path, script: str = _READER
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` where ``folder`` cannot be written: permissions, or (as root) a read-only mount."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    if os.geteuid() != 0:
        for p in folder.iterdir():
            p.chmod(0o444)
        folder.chmod(0o555)
        try:
            return subprocess.run(
                [sys.executable, "-c", script, str(path)],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
            )
        finally:
            folder.chmod(0o755)
    mount = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" || exit 99; shift; exec "$@"'
    try:
        proc = subprocess.run(
            [
                "unshare",
                "-m",
                "sh",
                "-c",
                mount,
                "sh",
                str(folder),
                sys.executable,
                "-c",
                script,
                str(path),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
    except FileNotFoundError:
        pytest.skip("running as root without unshare: no way to make a folder read-only")
    if proc.returncode == 99:
        pytest.skip(f"cannot mount read-only here: {proc.stderr.strip()}")
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("pending_wal", [False, True])
def test_a_wal_history_on_a_read_only_disk_is_readable(pending_wal: bool, tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "history.sqlite3"
    _valid_history(path, runs=3)
    if pending_wal:
        doc = tmp_path / "doc.json"
        doc.write_text(json.dumps(run_doc()))
        subprocess.run([sys.executable, "-c", _CRASHED_WRITER, str(path), str(doc)], check=True, timeout=60)
        assert Path(f"{path}-wal").stat().st_size > 0
    before = sorted(p.name for p in folder.iterdir())
    proc = _read_on_a_read_only_disk(folder, path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == list(range(1, 5 if pending_wal else 4))
    assert sorted(p.name for p in folder.iterdir()) == before


@pytest.mark.parametrize(
    ("column", "value"),
    [("result_json", "{not json"), ("fingerprint_json", "[1, 2]"), ("result_json", "NaN]")],
)
@pytest.mark.slow
def test_a_damaged_row_is_named_in_one_line(column: str, value: str, tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite3"
    _valid_history(path, runs=2)
    conn = sqlite3.connect(path)
    conn.execute(f"UPDATE runs SET {column} = ? WHERE id = 2", (value,))
    conn.commit()
    conn.close()
    with (
        open_store(path, create=False) as store,
        pytest.raises(HistoryError, match=r"run #2 is damaged") as err,
    ):
        store.get(2) if column == "result_json" else store.list()
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    proc = subprocess.run(
        [sys.executable, "-m", "pitstop", "history", "show", "2", "--history", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert proc.returncode == 2 and "run #2 is damaged" in proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr


_WRITER_THERE = """
import sys
from pitstop.errors import PitstopError
from pitstop.history import record
try:
    record({"schema": "pitstop.run/1"}, "doctor", path=sys.argv[1])
except PitstopError as exc:
    print(exc)
"""


@pytest.mark.slow
def test_recording_on_a_read_only_disk_says_so_in_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "history.sqlite3"
    _valid_history(path, runs=1)
    doc = json.dumps(run_doc())
    script = _WRITER_THERE.replace('{"schema": "pitstop.run/1"}', f"__import__('json').loads({doc!r})")
    proc = _read_on_a_read_only_disk(folder, path, script)
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    assert line.startswith(f"{path}: cannot be written here") and "--no-history" in line
