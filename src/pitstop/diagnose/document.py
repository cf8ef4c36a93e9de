"""One reader of saved ``pitstop.run/1`` documents: a Diagnosis again, whatever pitstop version wrote it.

Every renderer takes a Diagnosis; a saved document becomes one here and nowhere else. Documents written
before the results keys existed (``step_series``, ``gpu_windows``, ``shown_rank``, the newer metrics) are
read too: what they lack is computed from the profile they carry, by the same functions that compute it
for a live run; a metric that cannot be recomputed that way stays unknown.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pitstop import schemas
from pitstop.core.findings import Finding, Fix, Saving, Use, use
from pitstop.core.profile import Environment, RunProfile, from_jsonable, word
from pitstop.core.vocabulary import CauseId, RemedyId, Severity, Source
from pitstop.diagnose import Diagnosis
from pitstop.diagnose.causes import CAUSES
from pitstop.diagnose.cost import RunCost
from pitstop.diagnose.coverage import Coverage, coverage_of
from pitstop.diagnose.gpu_windows import gpu_windows
from pitstop.diagnose.metrics import Metrics, compute_metrics
from pitstop.diagnose.ranks import analyse, scaling
from pitstop.diagnose.results import RunResults, results_of
from pitstop.errors import PitstopError
from pitstop.remedies import REGISTRY

RESULT_KEYS = ("step_series", "gpu_windows", "shown_rank")


class RunDocumentError(PitstopError, ValueError):
    """A document that claims to be a pitstop run but cannot be read back."""


def read_run(doc: Any) -> Diagnosis:
    """The Diagnosis a ``pitstop.run/1`` document holds (or a bare ``pitstop.profile/1``, diagnosed now)."""
    if not isinstance(doc, dict):
        raise RunDocumentError(f"not a pitstop document: a JSON {type(doc).__name__}, not an object")
    if doc.get("schema") == schemas.PROFILE:
        from pitstop.diagnose import diagnose

        return diagnose(_profile(doc))
    if doc.get("schema") != schemas.RUN:
        raise RunDocumentError(f"not a {schemas.RUN} document (schema: {doc.get('schema')!r})")
    try:
        return _read(doc)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise RunDocumentError(
            f"the {schemas.RUN} document is incomplete or damaged ({type(exc).__name__}: {exc})"
        ) from None


def _profile(data: dict[str, Any]) -> RunProfile:
    try:
        return RunProfile.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RunDocumentError(f"the run's profile cannot be read ({type(exc).__name__}: {exc})") from None


def _read(doc: dict[str, Any]) -> Diagnosis:
    saved = doc.get("profile")
    if isinstance(saved, dict):
        profile = _profile(saved)
        for key in ("command", "exit_code"):  # the document's own header states them
            if key in doc:
                setattr(profile, key, doc[key])
        if "source" in doc:
            profile.source = _source(doc)
    else:  # a document without its profile: the environment table is all there is
        env = doc.get("environment")
        profile = RunProfile(
            source=_source(doc),
            command=doc.get("command"),
            exit_code=doc.get("exit_code"),
            run_environment=from_jsonable(Environment, env) if isinstance(env, dict) else None,
        )
    metrics = _metrics(doc.get("metrics"), profile)
    own_notes = set(profile.notes)
    analysis = analyse(profile)  # who waits for whom: derived from the saved collectives, as diagnose does
    findings = [_finding(f) for f in doc.get("findings") or []]
    skipped = _known_causes(doc.get("skipped_checks"))
    # what was checked as written; an older document's, from its profile
    coverage = Coverage.from_dict(doc.get("checks")) or coverage_of(
        profile, CAUSES.values(), skipped, [f.cause for f in findings]
    )
    return Diagnosis(
        profile=profile,
        metrics=metrics,
        findings=findings,
        skipped_checks=skipped,
        notes=[n for n in doc.get("notes") or [] if n not in own_notes],
        results=_results(doc, profile),
        ranks_analysis=analysis,
        scaling=scaling(profile, analysis, metrics.real_tokens_per_s or metrics.tokens_per_s),
        cost=_cost(doc.get("cost")),
        coverage=coverage,
    )


def _cost(saved: Any) -> RunCost | None:
    """The run's cost as written (only ``analyze`` wrote one before every command did; none without a price)."""
    if not isinstance(saved, dict) or not isinstance(saved.get("price_per_gpu_hour"), int | float):
        return None
    return from_jsonable(RunCost, saved)


def _metrics(saved: Any, profile: RunProfile) -> Metrics:
    """The saved metrics as written. A metric added after the first ``pitstop.run/1`` (a field with a
    default) that an older pitstop did not write is computed from the profile; a first-version metric the
    document lacks stays unknown (the writer did not know it)."""
    saved = saved if isinstance(saved, dict) else {}
    fields = dataclasses.fields(Metrics)
    names = [f.name for f in fields]
    added = {f.name for f in fields if f.default is not dataclasses.MISSING}
    missing = [n for n in added if n not in saved]
    fresh = compute_metrics(profile) if missing and profile.ranks else None
    values: dict[str, Any] = {n: saved.get(n) for n in names}
    for name in missing:
        values[name] = getattr(fresh, name) if fresh else None
    values["steps_measured"] = int(values.get("steps_measured") or 0)
    expected = values.get("expected_tokens_per_s")
    if isinstance(expected, list | tuple) and len(expected) == 2:
        values["expected_tokens_per_s"] = (float(expected[0]), float(expected[1]))
    return Metrics(**values)


def _results(doc: dict[str, Any], profile: RunProfile) -> RunResults:
    if all(k in doc for k in RESULT_KEYS):
        return RunResults.from_dict(doc)
    return results_of(profile, gpu_windows(profile))


def _source(doc: dict[str, Any]) -> Source:
    """What measured the run, as the document's header says (a newer pitstop's word kept as written)."""
    return word(Source, str(doc.get("source") or "run"))


def _known_causes(saved: Any) -> list[CauseId]:
    """The skipped checks a document lists, those this pitstop knows (a newer one's are left out)."""
    causes = (CauseId.parse(c) for c in saved) if isinstance(saved, list) else ()
    return [c for c in causes if c is not None]


def _finding(data: dict[str, Any]) -> Finding:
    cause = CauseId.parse(data["cause"])
    if cause is None:
        raise RunDocumentError(f"finding of an unknown cause {data['cause']!r} (written by a newer pitstop?)")
    try:
        severity = Severity(data.get("severity") or "low")
    except ValueError:
        raise RunDocumentError(
            f"finding {cause!r} has an unknown severity {data.get('severity')!r}"
        ) from None
    fix = data.get("fix") or {}
    framework = fix.get("framework")
    snippets = dict(fix.get("snippets") or {})
    if not snippets and fix.get("snippet"):
        snippets = {framework or "pytorch": fix["snippet"]}
    return Finding(
        cause=cause,
        severity=severity,
        confidence=float(data.get("confidence") or 0.0),
        summary=str(data.get("summary") or ""),
        evidence=dict(data.get("evidence") or {}),
        est_speedup=data.get("est_speedup"),
        speedup_basis=str(data.get("speedup_basis") or ""),
        fix=Fix(text=str(fix.get("text") or ""), snippets=snippets, framework=framework, uses=_uses(fix)),
        saving=Saving.from_dict(data.get("saving")),  # documents before savings have none
        title=CAUSES[cause].title,  # today's words for the cause, whatever the document's pitstop called it
    )


def _uses(fix: dict[str, Any]) -> tuple[Use, ...]:
    """The remedies a saved fix was built from (documents before remedies have none; unknown ids are
    a newer pitstop's and are left out)."""
    uses = []
    for item in fix.get("remedies") or []:
        if isinstance(item, dict) and item.get("id") in {str(r) for r in REGISTRY}:
            uses.append(use(RemedyId(item["id"]), **dict(item.get("params") or {})))
    return tuple(uses)
