"""Issue 42, item 10: `make demo` installs only what the demo needs; one history per project (git root) with the
old shared file still read; `history compare` shows each run's noise band; `data stats` prices the padding the
job uses (max_length included)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import tomllib
import typer
from tests.cache_inputs import number_rows, number_tokenizer
from tests.factories import profile, steps
from typer.testing import CliRunner

from pitstop.cli.data import data_app
from pitstop.cli.history import history_app
from pitstop.core.profile import StepRecord
from pitstop.data.stats import job_padding, length_stats
from pitstop.diagnose import diagnose
from pitstop.history import compare_runs, default_path, open_store, record
from pitstop.history.paths import legacy_path, project_file_name, project_root

ROOT = Path(__file__).resolve().parents[2]
app = typer.Typer()
app.add_typer(history_app, name="history")
app.add_typer(data_app, name="data")
runner = CliRunner()


def cli(*args: str) -> Any:
    return runner.invoke(app, list(args), env={"COLUMNS": "220"})


# -- make demo --------------------------------------------------------------------------------------------


def makefile_rules(text: str) -> dict[str, tuple[list[str], list[str]]]:
    """``{target: (prerequisites, recipe lines)}`` with the Makefile's own variables expanded."""
    variables: dict[str, str] = {}
    rules: dict[str, tuple[list[str], list[str]]] = {}

    def expand(value: str) -> str:
        for _ in range(5):
            value = re.sub(r"\$\((\w+)\)", lambda m: variables.get(m.group(1), m.group(0)), value)
        return value

    current: str | None = None
    for line in text.splitlines():
        if line.startswith("\t") and current is not None:
            rules[current][1].append(expand(line.strip()))
            continue
        assignment = re.match(r"^(\w+)\s*(\?=|:=|=)\s*(.*)$", line)
        if assignment:
            variables[assignment.group(1)] = assignment.group(3).strip()
            current = None
            continue
        rule = re.match(r"^([^\s:#=][^:=]*):(?!=)\s*(.*)$", line)
        if rule and not line.startswith("."):
            current = expand(rule.group(1).strip())
            rules[current] = (expand(rule.group(2)).split(), [])
        elif not line.strip().startswith("#") and line.strip():
            current = None
    return rules


def installs_for(rules: dict[str, tuple[list[str], list[str]]], target: str) -> list[str]:
    """Every pip install line a target runs, its prerequisites' first."""
    seen: set[str] = set()
    lines: list[str] = []

    def walk(name: str) -> None:
        if name in seen or name not in rules:
            return
        seen.add(name)
        prerequisites, recipe = rules[name]
        for prerequisite in prerequisites:
            walk(prerequisite)
        lines.extend(line for line in recipe if "pip" in line and " install" in line)

    walk(target)
    return lines


def extras_named(line: str) -> set[str]:
    return {e.strip() for group in re.findall(r"\.\[([^\]]*)\]", line) for e in group.split(",")}


def test_make_demo_installs_no_test_or_docs_tools() -> None:
    rules = makefile_rules((ROOT / "Makefile").read_text())
    demo = installs_for(rules, "demo")
    assert demo, "make demo installs nothing?"
    assert any("demo" in extras_named(line) for line in demo), demo  # pitstop with the demo extra
    named = " ".join(demo)
    assert not {"dev", "docs", "hf"} & set().union(*map(extras_named, demo)), demo
    for tool in ("deepspeed", "DEEPSPEED", "mkdocs", "pytest", "ruff", "mypy"):
        assert tool not in named, (tool, demo)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    demo_packages = " ".join(extras["demo"])
    assert "transformers" in demo_packages and not re.search(
        "pytest|ruff|mypy|mkdocs|deepspeed", demo_packages
    )
    # the tests and the docs still get everything: dev and docs extras, DeepSpeed for the launcher tests
    for target in ("test", "test-all", "docs", "dist-check", "setup"):
        lines = installs_for(rules, target)
        assert {"dev", "docs"} <= set().union(*map(extras_named, lines)), (target, lines)
        assert any("DS_BUILD_OPS" in line or "deepspeed" in line for line in lines), target


# -- one history per project ------------------------------------------------------------------------------


def run_doc(wall: float = 0.10, jitter: float = 0.0) -> dict[str, Any]:
    """A real diagnosis; ``jitter`` slows every other block of 5 steps by that fraction (a measured spread)."""
    records: list[StepRecord] = steps(n=40, wall=wall, real_frac=0.9)
    for i, step in enumerate(records):
        step.wall_s = wall * (1 + jitter * ((i // 5) % 2))
    return diagnose(profile("cpu", records)).to_dict()


@pytest.fixture
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user data folder in tmp, no $PITSTOP_HISTORY: the default, per-project path is used."""
    home = tmp_path / "data"
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PITSTOP_HISTORY", raising=False)
    return home


def git_repo(path: Path) -> Path:
    (path / ".git").mkdir(parents=True)
    (path / "src").mkdir()
    return path


def test_two_git_repos_get_two_histories(
    data_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = git_repo(tmp_path / "work" / "proj"), git_repo(tmp_path / "other" / "proj")  # same name
    monkeypatch.chdir(one / "src")  # a job started in a sub-folder belongs to its checkout
    assert project_root() == one.resolve()
    first = record(run_doc(), "doctor")
    path_one = default_path()
    monkeypatch.chdir(two)
    record(run_doc(0.2), "doctor")
    path_two = default_path()
    assert path_one != path_two
    assert path_one.parent == path_two.parent == data_home / "pitstop" / "history"
    assert path_one.name.startswith("proj-") and path_one.name.endswith(".sqlite3")
    for path in (path_one, path_two):
        with open_store(path, create=False) as store:
            assert store.count() == 1
    monkeypatch.chdir(one)
    listed = cli("history", "list", "--json")
    assert listed.exit_code == 0, listed.output
    assert [r["id"] for r in json.loads(listed.stdout)] == [first]
    # outside a checkout the folder itself is the project
    plain = tmp_path / "plain"
    plain.mkdir()
    monkeypatch.chdir(plain)
    assert default_path().name == project_file_name(plain.resolve())
    # nothing was written anywhere but the data folder
    assert sorted(p.name for p in (one / ".git").iterdir()) == [] and not (tmp_path / "home").exists()


def test_pitstop_history_still_overrides(
    data_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(git_repo(tmp_path / "repo"))
    chosen = tmp_path / "mine.sqlite3"
    monkeypatch.setenv("PITSTOP_HISTORY", str(chosen))
    assert default_path() == chosen
    record(run_doc(), "doctor")
    assert chosen.is_file() and not (data_home / "pitstop").exists()


def test_the_old_shared_history_is_still_read(
    data_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = legacy_path()
    assert old == data_home / "pitstop" / "history.sqlite3"
    old_id = record(run_doc(), "doctor", path=old, label="before")
    before = old.read_bytes()
    repo = git_repo(tmp_path / "repo")
    monkeypatch.chdir(repo)
    new_id = record(run_doc(0.2), "doctor")  # a new run goes to the project's own file, not the old one
    assert default_path() != old and old.read_bytes() == before

    listing = cli("history", "list")
    assert listing.exit_code == 0, listing.output
    assert f"--history {old}" in " ".join(listing.stdout.split())  # says where the earlier runs are
    shown = cli("history", "show", str(old_id), "--history", str(old))
    assert shown.exit_code == 0 and "before" in shown.stdout
    missing = cli("history", "show", "7")
    assert missing.exit_code == 2 and f"--history {old}" in " ".join(missing.stderr.split())

    projects = cli("history", "list", "--all-projects", "--json")
    assert projects.exit_code == 0, projects.output
    entries = {Path(e["path"]): e for e in json.loads(projects.stdout)}
    assert entries[old]["runs"] == 1 and "before per-project" in entries[old]["project"]
    assert entries[default_path()]["runs"] == 1 and entries[default_path()]["current"] is True
    table = cli("history", "list", "--all-projects")
    assert table.exit_code == 0 and "(here)" in table.stdout
    assert old.read_bytes() == before and new_id == 1  # read, never written


# -- compare's noise band ---------------------------------------------------------------------------------


def test_compare_says_within_noise_for_two_runs_of_equal_rate_and_spread(history_file: Path) -> None:
    a = record(run_doc(0.10, jitter=0.6), "doctor")
    b = record(run_doc(0.10, jitter=0.6), "doctor")
    with open_store(history_file, create=False) as store:
        comparison = compare_runs(store.get(a), store.get(b))  # type: ignore[arg-type]
    row = next(r for r in comparison.rows if r.name == "real_tokens_per_s")
    assert row.band_a is not None and row.band_a > 0 and row.band_a == row.band_b  # the spread each measured
    assert row.ratio == pytest.approx(1.0) and row.within_noise is True
    low, high = row.ratio_range  # type: ignore[misc]
    assert low < 1.0 < high
    result = cli("history", "compare", str(a), str(b))
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "within noise" in text and "noise band" in text and f"±{row.band_a:.1%}" in text


def test_compare_a_gap_wider_than_both_bands_is_beyond_noise(history_file: Path) -> None:
    # steady runs measure a tiny spread: a 30% slower B stands out of it
    a = record(run_doc(0.10, jitter=0.0), "doctor")
    b = record(run_doc(0.13, jitter=0.0), "doctor")
    with open_store(history_file, create=False) as store:
        comparison = compare_runs(store.get(a), store.get(b))  # type: ignore[arg-type]
    row = next(r for r in comparison.rows if r.name == "real_tokens_per_s")
    assert row.within_noise is False
    assert any("beyond noise" in line for line in comparison.noise_lines())
    # a jittery pair cannot tell a 5% gap from its noise (each run's band is several percent)
    c = record(run_doc(0.10, jitter=0.8), "doctor")
    d = record(run_doc(0.105, jitter=0.8), "doctor")
    with open_store(history_file, create=False) as store:
        noisy = compare_runs(store.get(c), store.get(d))  # type: ignore[arg-type]
    noisy_row = next(r for r in noisy.rows if r.name == "real_tokens_per_s")
    assert noisy_row.ratio is not None and noisy_row.ratio < 0.97 and noisy_row.within_noise is True


# -- data stats with max_length padding -------------------------------------------------------------------


def test_waste_is_priced_against_max_length() -> None:
    lengths = [10, 20, 30, 40] * 8  # 32 examples, every one far shorter than the 100-token rows
    padded = length_stats(lengths, batch_size=8, max_len=100, padding="max_length")
    assert padded.padding_now == pytest.approx(1 - sum(lengths) / (100 * len(lengths)))  # 75% padding
    longest = length_stats(lengths, batch_size=8, max_len=100)
    assert longest.padding_now < padded.padding_now and longest.padding == "longest"
    assert padded.speedup_packed > longest.speedup_packed > 1  # packing saves more against max_length rows
    assert "max_length" in padded.padding_basis


def doctor_doc_padding_to(width: int, batch: int) -> dict[str, Any]:
    """A real diagnosis of a job whose tokenizer call pads every example to ``width`` (padding="max_length")."""
    prof = profile("cpu", steps(n=20, rows=batch, row_len=width, real_frac=0.3))
    prof.environment.micro_batch_size = batch
    prof.environment.dataloader.batch_size = batch
    prof.environment.dataloader.tokenizer_pads_to = width
    prof.environment.dataloader.tokenizer_padding_site = "train.py:57"
    return diagnose(prof).to_dict()


def test_the_padding_is_read_from_the_jobs_doctor_result() -> None:
    seen = job_padding(doctor_doc_padding_to(64, 4))
    assert (seen.padding, seen.max_len, seen.batch_size) == (
        "max_length",
        64,
        4,
    ) and "train.py:57" in seen.basis
    # without the tokenizer call seen, padding_waste's evidence (every batch one width) says the same
    unseen = doctor_doc_padding_to(64, 4)
    unseen["environment"]["dataloader"]["tokenizer_pads_to"] = None
    fallback = job_padding(unseen)
    assert (fallback.padding, fallback.max_len) == ("max_length", 64) and "64 tokens wide" in fallback.basis
    assert job_padding({"schema": "pitstop.run/1", "findings": "junk"}).padding == "longest"


@pytest.mark.slow  # the token cache is built by a worker process
def test_data_stats_prices_the_runs_max_length_padding(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    from pitstop.data.cache import build_cache

    source = tmp_path / "train.jsonl"
    source.write_text(number_rows(40))
    cache = build_cache(source, number_tokenizer(tmp_path / "tok"), tmp_path / "cache", workers=1)
    run = tmp_path / "run.json"
    run.write_text(json.dumps(doctor_doc_padding_to(512, 4), default=str))

    out = tmp_path / "stats.json"
    result = cli("data", "stats", str(cache), "--run", str(run), "--json", str(out))
    assert result.exit_code == 0, result.output
    stats = json.loads(out.read_text())
    assert stats["padding"] == "max_length" and stats["max_len"] == 512 and stats["batch_size"] == 4
    lengths = [min(n, 512) for n in _lengths(cache)]
    assert stats["padding_now"] == pytest.approx(1 - sum(lengths) / (512 * len(lengths)))
    assert stats["padding_now"] > 0.5 and "padding assumed: max_length" in result.stdout
    assert "train.py:57" in result.stdout

    default = cli("data", "stats", str(cache), "--max-length", "512", "--json", str(out))
    assert default.exit_code == 0, default.output
    assert "padding assumed: longest (the default, not measured" in " ".join(default.stdout.split())
    assert json.loads(out.read_text())["padding_now"] < stats["padding_now"]


def _lengths(cache: Path) -> list[int]:
    from pitstop.data.cache import open_cache

    return [int(n) for n in open_cache(cache).lengths]
