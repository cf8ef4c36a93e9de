"""Issue 42, item 10 on the newcomer's Trainer job (``tests/scripts/newcomer_trainer.py``: every example padded
to ``max_length`` by the tokenizer): ``pitstop doctor`` started in the job's checkout records into that
project's own history file, and ``pitstop data stats --run`` prices the job's data padded the way the job
pads it (max_length, 256), to the share doctor measured from the attention masks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_pitstop

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "tests" / "scripts" / "newcomer_trainer.py"
JOB = [sys.executable, str(SCRIPT), "--steps", "400"]


def newcomer_data(folder: Path) -> tuple[Path, Path]:
    """The job's own corpus as JSONL and its tokenizer as a folder, made by the job's own functions."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import newcomer_trainer as job
    finally:
        sys.path.remove(str(SCRIPT.parent))
    texts = job.corpus(2000)
    data = folder / "corpus.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok = folder / "tok"
    tok.mkdir()
    job.tokenizer_for(texts).backend_tokenizer.save(str(tok / "tokenizer.json"))
    (tok / "tokenizer_config.json").write_text(json.dumps({"pad_token": "[PAD]", "eos_token": "[EOS]"}))
    return data, tok


def test_newcomer_job_history_per_project_and_its_padding_priced(tmp_path: Path) -> None:
    project = tmp_path / "newcomer"
    (project / ".git").mkdir(parents=True)
    data_home = tmp_path / "data"
    env = {"XDG_DATA_HOME": str(data_home), "PITSTOP_HISTORY": ""}  # the default: the project's own file
    run = tmp_path / "run.json"
    doctor = run_pitstop(
        "doctor", "--warmup", "2", "--steps", "8", "--json", str(run), "--", *JOB,
        cwd=project, env=env, timeout=600,
    )  # fmt: skip
    assert doctor.returncode == 0, doctor.stderr[-4000:]
    files = sorted((data_home / "pitstop" / "history").glob("*.sqlite3"))
    assert [f.name.split("-")[0] for f in files] == ["newcomer"], files
    assert not (data_home / "pitstop" / "history.sqlite3").exists()
    listed = run_pitstop("history", "list", "--all-projects", "--json", cwd=project, env=env)
    assert listed.returncode == 0, listed.stderr
    (entry,) = json.loads(listed.stdout)
    assert entry["current"] is True and entry["runs"] == 1 and entry["path"] == str(files[0])

    doc = json.loads(run.read_text())
    measured = doc["metrics"]["padding_frac"]
    data, tok = newcomer_data(tmp_path)
    common = [str(data), "--tokenizer", str(tok), "--template", "plain"]
    priced = tmp_path / "stats.json"
    stats = run_pitstop("data", "stats", *common, "--run", str(run), "--json", str(priced), timeout=300)
    assert stats.returncode == 0, stats.stderr[-4000:]
    figures = json.loads(priced.read_text())
    assert (figures["padding"], figures["max_len"], figures["batch_size"]) == ("max_length", 256, 8)
    assert "newcomer_trainer.py:" in figures["padding_basis"]  # the job's tokenizer call, by its line
    assert figures["padding_now"] == pytest.approx(measured, abs=0.08)  # what doctor measured from the masks
    assert "padding assumed: max_length" in stats.stdout

    default = run_pitstop("data", "stats", *common, "--json", str(priced), timeout=300)
    assert default.returncode == 0, default.stderr[-4000:]
    assumed = json.loads(priced.read_text())
    assert assumed["padding"] == "longest" and "the default" in assumed["padding_basis"]
    assert assumed["padding_now"] < measured - 0.2  # what the old default told this job: far too little
