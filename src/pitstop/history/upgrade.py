"""Comparing across library versions: the previous run of a workload handed to the rules, and two stored runs
judged by the library_upgrade rule.

Versions are no part of the fingerprint, so a run after ``pip install -U`` lands next to the run before it.
``pitstop doctor`` (with its history on) reads the newest run of the same fingerprint and kind before it
records its own and puts it in ``RunProfile.baseline``, where the rule sees it; ``history compare`` and
``history check`` call the same judgement (``library_upgrade.judge``) on the two runs they show. The history
sits above the rules (layer 5 over 3): it fills the profile and calls them, they never read it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pitstop.history.errors import HistoryError
from pitstop.history.fingerprint import fingerprint, versions_of
from pitstop.history.store import RunRecord, open_store

if TYPE_CHECKING:
    from pitstop.core.findings import Finding
    from pitstop.core.profile import HistoryRun
    from pitstop.diagnose.causes.library_upgrade import PhaseDelta, VersionChange


def _run_document(doc: Any) -> dict[str, Any]:
    """The run document of a stored result (a tune's: its baseline run, measured without fixes)."""
    if isinstance(doc, dict) and isinstance(doc.get("baseline_run"), dict):
        return dict(doc["baseline_run"])
    return doc if isinstance(doc, dict) else {}


def history_run_of(record: RunRecord) -> HistoryRun:
    """A stored run's facts for the comparison: its versions, speed, spread and phases per step."""
    from pitstop.diagnose.causes.library_upgrade import history_run

    doc = _run_document(record.result)
    metrics = doc.get("metrics")
    return history_run(
        metrics if isinstance(metrics, dict) else {},
        versions_of(doc),
        run_id=record.id,
        created_at=record.created_at,
        label=record.label,
        kind=record.kind,
    )


def framework_of(record: RunRecord) -> str | None:
    env = _run_document(record.result).get("environment")
    value = env.get("framework") if isinstance(env, dict) else None
    return value if isinstance(value, str) else None


def upgrade_finding(run: RunRecord, baseline: RunRecord) -> Finding | None:
    """library_upgrade's finding for ``run`` against ``baseline`` (both loaded with their documents)."""
    from pitstop.diagnose.causes.library_upgrade import judge

    return judge(history_run_of(run), history_run_of(baseline), framework_of(run))


def version_changes_of(a: RunRecord, b: RunRecord) -> list[VersionChange]:
    """The packages whose recorded versions differ from run A to run B."""
    from pitstop.diagnose.causes.library_upgrade import version_changes

    return version_changes(a.versions, b.versions)


def phase_changes_of(a: RunRecord, b: RunRecord) -> list[PhaseDelta]:
    """Seconds per step in each phase both runs timed, A and B."""
    from pitstop.diagnose.causes.library_upgrade import phase_deltas

    return phase_deltas(history_run_of(a), history_run_of(b))


def previous_run(doc: dict[str, Any], kind: str, path: Path | None) -> HistoryRun | None:
    """The newest stored run of ``doc``'s workload (the same fingerprint and kind) whose job did not fail, or
    None: none yet, or a history that cannot be read (it is a help here, never a reason to lose the run)."""
    try:
        with open_store(path, create=False) as store:
            found = store.latest(kind=kind, fingerprint=fingerprint(doc), include_failed=False)
    except (HistoryError, OSError, RuntimeError, sqlite3.Error):
        return None
    return None if found is None else history_run_of(found)
