"""library_upgrade and pin_versions, and the history comparing across versions: the fingerprint without
versions, an older history whose fingerprints had them, the judgement on two runs, the fix's words."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from tests.factories import profile, steps

from pitstop.core.profile import HistoryRun, RunProfile
from pitstop.core.vocabulary import Framework, Phase, RemedyId
from pitstop.diagnose import diagnose
from pitstop.diagnose.causes.library_upgrade import (
    MIN_SLOWDOWN,
    UNMEASURED_SLOWDOWN,
    history_run,
    judge,
    resolvable_drop,
    version_changes,
)
from pitstop.history import compare_runs, find_baseline, fingerprint, fingerprint_fields, open_store, record
from pitstop.history.calibration import calibrations
from pitstop.history.fingerprint import canonical_json, versions_of
from pitstop.history.upgrade import previous_run
from pitstop.remedies import remedy
from pitstop.remedies.pin_versions import pin

OLD = {"torch": "2.8.0+cu128", "transformers": "4.57.1", "accelerate": "1.10.1"}
NEW = {"torch": "2.9.1+cu128", "transformers": "5.0.0", "accelerate": "1.10.1"}


def run_doc(versions: dict[str, str], wall: float = 0.10, fwd: float | None = None) -> dict[str, Any]:
    """A ``pitstop.run/1`` document of a hand-made H100 profile; ``fwd`` the forward's seconds per step."""
    prof = profile(
        "cuda",
        steps(wall=wall, data=0.001, fwd=fwd, real_frac=0.99),
        util=97.0,
        versions=dict(versions),
    )
    return diagnose(prof).to_dict()


def facts(doc: dict[str, Any], run_id: int | None = None) -> HistoryRun:
    return history_run(
        doc["metrics"], versions_of(doc), run_id=run_id, created_at="2026-01-05T10:00:00+00:00"
    )


# -- the fingerprint --------------------------------------------------------------------------------------


def test_an_upgrade_keeps_the_fingerprint_and_the_document_keeps_the_versions() -> None:
    before, after = run_doc(OLD), run_doc(NEW, wall=0.2)
    assert fingerprint(before) == fingerprint(after)
    assert "versions" not in fingerprint_fields(after)
    assert versions_of(after) == NEW
    tune = {"schema": "pitstop.tune/1", "baseline_run": after, "best": {}}
    assert versions_of(tune) == NEW  # a tune result: its baseline run's


def _old_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint fields as pitstop wrote them while versions (major.minor) were part of them."""
    minor = {k: ".".join(v.split("+")[0].split(".")[:2]) for k, v in sorted(versions_of(doc).items())}
    return {**fingerprint_fields(doc), "versions": minor}


def _insert_old_row(path: Path, doc: dict[str, Any], kind: str = "doctor", label: str = "main") -> int:
    """A row exactly as the older pitstop stored it: its fingerprint the hash of the fields with versions."""
    fields = _old_fields(doc)
    old_fp = hashlib.sha256(canonical_json(fields).encode()).hexdigest()[:12]
    metrics = doc["metrics"]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        cursor = conn.execute(
            "INSERT INTO runs (created_at, kind, label, git_commit, command, fingerprint, fingerprint_json, "
            "real_tokens_per_s, tokens_per_s, step_time_s, mfu, result_json) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                "2026-01-05T10:00:00+00:00", kind, label, None, "python train.py", old_fp, canonical_json(fields),
                metrics["real_tokens_per_s"], metrics["tokens_per_s"], metrics["step_time_s"], metrics["mfu"],
                json.dumps(doc),
            ),
        )  # fmt: skip
        assert cursor.lastrowid is not None
        return cursor.lastrowid
    finally:
        conn.close()


def test_an_older_history_still_matches_and_is_not_modified(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite3"
    with open_store(path):
        pass  # an empty history, the schema the older pitstop wrote too
    old_doc = run_doc(OLD)
    old_id = _insert_old_row(path, old_doc)
    before = path.read_bytes()
    new_doc = run_doc(NEW, wall=0.2)
    with open_store(path, create=False) as store:
        stored = store.get(old_id)
        assert stored is not None and stored.fingerprint == fingerprint(new_doc)  # read as matched now
        assert "versions" not in stored.fingerprint_fields and stored.versions == OLD
        found = store.latest(kind="doctor", fingerprint=fingerprint(new_doc))
        assert found is not None and found.id == old_id
        assert [r.fingerprint for r in store.list()] == [fingerprint(new_doc)]
    assert path.read_bytes() == before  # reading changes nothing
    assert previous_run(new_doc, "doctor", path) == facts_of_stored(old_doc, old_id)
    new_id = record(new_doc, "doctor", path, label="pr")
    with open_store(path, create=False) as store:
        run = store.get(new_id)
        assert run is not None
        base = find_baseline(store, run, "main")  # the old row, by label and today's fingerprint
        assert base.id == old_id
        comparison = compare_runs(base, run)
    assert comparison.finding is not None and comparison.finding.evidence["packages_changed"] == {
        "torch": "2.8.0+cu128 → 2.9.1+cu128",
        "transformers": "4.57.1 → 5.0.0",
    }
    # an older row newer than a new one is still the newest match
    newer_old = _insert_old_row(path, run_doc(OLD, wall=0.11))
    with open_store(path, create=False) as store:
        latest = store.latest(fingerprint=fingerprint(new_doc))
        assert latest is not None and latest.id == newer_old
        assert store.latest(fingerprint="0" * 12) is None
        assert calibrations(store, fingerprint(new_doc)) == []  # filters by the matched fingerprint


def facts_of_stored(doc: dict[str, Any], run_id: int) -> HistoryRun:
    return history_run(
        doc["metrics"], versions_of(doc), run_id=run_id, created_at="2026-01-05T10:00:00+00:00",
        label="main", kind="doctor",
    )  # fmt: skip


def test_a_damaged_old_row_matches_nothing(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite3"
    good = record(run_doc(NEW), "doctor", path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(
        "INSERT INTO runs (created_at, kind, fingerprint, fingerprint_json, result_json) VALUES (?,?,?,?,?)",
        ("2026-01-06T00:00:00+00:00", "doctor", "abc", '{"versions": {', "{}"),
    )
    conn.close()
    with open_store(path, create=False) as store:
        found = store.latest(fingerprint=fingerprint(run_doc(NEW)))
        assert found is not None and found.id == good


# -- the judgement ----------------------------------------------------------------------------------------


def test_slower_after_an_upgrade_names_the_packages_the_phase_and_the_ratio() -> None:
    base = facts(run_doc(OLD, wall=0.10, fwd=0.03), run_id=7)
    now = facts(run_doc(NEW, wall=0.16, fwd=0.09))
    finding = judge(now, base, "hf_trainer")
    assert finding is not None and finding.cause == "library_upgrade"
    ev = finding.evidence
    assert ev["packages_changed"] == {"torch": "2.8.0+cu128 → 2.9.1+cu128", "transformers": "4.57.1 → 5.0.0"}
    assert ev["baseline_run"] == 7 and ev["metric"] == "real_tokens_per_s"
    assert ev["throughput_ratio"] == pytest.approx(0.625, rel=1e-3)
    assert ev["slowest_phase"] == Phase.FORWARD.label
    assert ev["slowest_phase_delta_ms"] == pytest.approx(60.0, rel=1e-3)
    assert finding.est_speedup == pytest.approx(1.6, rel=1e-3)
    assert finding.speedup_basis.startswith("the baseline run #7 on 2026-01-05 with torch 2.8.0+cu128")
    assert "accelerate" not in finding.summary  # unchanged packages are not named
    use = finding.fix.uses[0]
    assert use.remedy == RemedyId.PIN_VERSIONS and use.params["phase"] == "forward"
    assert 'pip install "torch==2.8.*" "transformers==4.57.*"' in finding.fix.snippets["hf_trainer"]
    assert 'gradient_checkpointing_kwargs={"use_reentrant": False}' in finding.fix.snippets["hf_trainer"]


@pytest.mark.parametrize(
    ("now_versions", "wall", "why"),
    [
        (OLD, 0.20, "the same versions: whatever slowed it, not an upgrade"),
        (NEW, 0.10 / (1 - MIN_SLOWDOWN / 2), "slower by less than the margin"),
        (NEW, 0.08, "faster"),
        ({**OLD, "xformers": "0.0.33"}, 0.20, "a package loaded only now is no upgrade"),
    ],
)
def test_no_finding(now_versions: dict[str, str], wall: float, why: str) -> None:
    base, now = facts(run_doc(OLD), 1), facts(run_doc(now_versions, wall=wall))
    assert judge(now, base, None) is None, why


def test_the_margin_follows_the_runs_noise() -> None:
    base, now = facts(run_doc(OLD), 1), facts(run_doc(NEW, wall=0.13))  # 23% slower
    assert judge(now, base, None) is not None  # no spread in the hand-made steps: MIN_SLOWDOWN applies
    noisy = HistoryRun(**{**vars(now), "throughput_spread": 0.10})
    noisy_base = HistoryRun(**{**vars(base), "throughput_spread": 0.10})
    assert resolvable_drop(0.10, 0.10) == pytest.approx(0.2828, rel=1e-3)
    assert judge(noisy, noisy_base, None) is None  # 23% is within 2 standard errors of the difference
    unmeasured = HistoryRun(**{**vars(now), "throughput_spread": None})
    assert judge(unmeasured, base, None) is not None  # 23% > UNMEASURED_SLOWDOWN
    assert UNMEASURED_SLOWDOWN < 0.23


def test_version_changes() -> None:
    changes = version_changes({"torch": "2.8.0", "peft": "0.17.0"}, {"torch": "2.9.0", "trl": "0.24.0"})
    assert [str(c) for c in changes] == [
        "peft 0.17.0 → not loaded",
        "torch 2.8.0 → 2.9.0",
        "trl not loaded → 0.24.0",
    ]


# -- the rule, through diagnose ---------------------------------------------------------------------------


def test_the_rule_reads_the_baseline_the_history_put_in_the_profile() -> None:
    prof = profile("cuda", steps(wall=0.2, data=0.001, real_frac=0.99), util=97.0, versions=dict(NEW))
    assert "library_upgrade" not in [f.cause for f in diagnose(prof).findings]  # no baseline, no finding
    prof.baseline = facts(run_doc(OLD), run_id=3)
    doc = diagnose(prof).to_dict()
    found = [f for f in doc["findings"] if f["cause"] == "library_upgrade"]
    assert found and found[0]["evidence"]["baseline_run"] == 3
    # the baseline travels in the profile
    again = RunProfile.from_dict(json.loads(json.dumps(doc["profile"])))
    assert again.baseline == prof.baseline


# -- the remedy ------------------------------------------------------------------------------------------


def test_pin() -> None:
    assert pin("transformers", "4.57.1") == "transformers==4.57.*"
    assert pin("torch", "2.8.0+cu128") == "torch==2.8.*"
    assert pin("flash_attn", "2.7.4.post1") == "flash-attn==2.7.*"
    assert pin("bitsandbytes", "nightly") == "bitsandbytes==nightly"


def test_advice_names_the_packages_the_phase_and_upstream_in_every_framework() -> None:
    params = {
        "changed": [{"package": "deepspeed", "old": "0.16.4", "new": "0.18.0"}],
        "phase": "optimizer",
        "baseline_run": 12,
    }
    for fw in Framework:
        advice = remedy(RemedyId.PIN_VERSIONS).advice(fw, params)
        assert 'pip install "deepspeed==0.16.*"' in advice.snippet
        assert "run #12" in advice.text and "deepspeed 0.18.0 → 0.16.4" in advice.text
        assert "optimizer" in advice.text and "github.com/deepspeedai/DeepSpeed/issues" in advice.text
    assert "overlap_comm" in remedy(RemedyId.PIN_VERSIONS).advice(Framework.DEEPSPEED, params).snippet
