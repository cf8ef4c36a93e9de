"""The documents' words are enums: a cause id is a CauseId everywhere in the code, and a string in JSON.

Writing a document and reading it back gives the same words, typed again; an id this pitstop does not know
(a newer one wrote it) is refused for a finding and left out of the skipped checks."""

from __future__ import annotations

import json

import pytest
from tests.factories import profile, steps

from pitstop.core.findings import Finding, Fix
from pitstop.core.profile import RunProfile
from pitstop.core.vocabulary import CauseId, Device, RemedyId, Severity, Source
from pitstop.diagnose import diagnose
from pitstop.diagnose.causes import CAUSES
from pitstop.diagnose.document import RunDocumentError, read_run
from pitstop.remedies import REGISTRY


def test_every_cause_id_has_its_module_and_no_module_another_id() -> None:
    assert list(CAUSES) == list(CauseId)
    for cause_id, entry in CAUSES.items():
        assert entry.id is cause_id
        assert entry.title and entry.because and entry.fires_when and entry.estimate
        # one module per cause, named by its id
        assert entry.rule.__module__ == f"pitstop.diagnose.causes.{cause_id}", entry.rule.__module__


def test_every_cause_names_its_remedies_by_id() -> None:
    for entry in CAUSES.values():
        assert entry.remedies and all(type(r) is RemedyId for r in entry.remedies), entry.id
    assert all(type(remedy.id) is RemedyId for remedy in REGISTRY.values())


def test_parse_takes_only_known_ids() -> None:
    assert CauseId.parse("padding_waste") is CauseId.PADDING_WASTE
    assert CauseId.parse("no_such_cause") is None
    assert CauseId.parse(3) is None and CauseId.parse(None) is None


def test_a_finding_takes_a_cause_string_and_keeps_the_member() -> None:
    f = Finding("host_sync", Severity.LOW, 0.5, "s", {}, None, "", Fix("t"))  # type: ignore[arg-type]
    assert f.cause is CauseId.HOST_SYNC
    with pytest.raises(ValueError, match="no_such_cause"):
        Finding("no_such_cause", Severity.LOW, 0.5, "s", {}, None, "", Fix("t"))  # type: ignore[arg-type]


def test_json_carries_plain_strings_and_reads_back_as_members() -> None:
    d = diagnose(profile("cpu", steps(real_frac=0.5)))
    assert d.findings and d.skipped_checks  # padding on a CPU run: GPU-only checks are skipped
    text = json.dumps(d.to_dict())
    doc = json.loads(text)
    causes = [f["cause"] for f in doc["findings"]]
    assert causes == [str(f.cause) for f in d.findings] and all(type(c) is str for c in causes)
    assert '"cause": "padding_waste"' in text
    assert doc["skipped_checks"] == [str(c) for c in d.skipped_checks]
    back = read_run(doc)
    assert [f.cause for f in back.findings] == [f.cause for f in d.findings]
    assert all(type(f.cause) is CauseId for f in back.findings)
    # every finding carries its cause's title, as the rule gave it and as read back
    assert (
        [f.title for f in back.findings]
        == [CAUSES[f.cause].title for f in d.findings]
        == [f["title"] for f in doc["findings"]]
    )
    assert back.skipped_checks == d.skipped_checks and all(type(c) is CauseId for c in back.skipped_checks)
    assert json.dumps(back.to_dict()["findings"]) == json.dumps(doc["findings"])


def test_ids_of_a_newer_pitstop() -> None:
    doc = json.loads(json.dumps(diagnose(profile("cpu", steps(real_frac=0.5))).to_dict()))
    doc["skipped_checks"] = ["idle_gpu", "a_cause_from_the_future"]
    assert read_run(doc).skipped_checks == [CauseId.IDLE_GPU]
    doc["findings"][0]["cause"] = "a_cause_from_the_future"
    with pytest.raises(RunDocumentError, match="unknown cause 'a_cause_from_the_future'"):
        read_run(doc)


def test_a_saved_profile_reads_back_its_device_and_source_as_members() -> None:
    p = profile("cuda", steps())
    p.source = Source.ANALYZE
    doc = json.loads(json.dumps(p.to_dict()))
    assert doc["source"] == "analyze" and doc["ranks"][0]["environment"]["device"] == "cuda"
    back = RunProfile.from_dict(doc)
    assert back.source is Source.ANALYZE and back.environment.device is Device.CUDA
    assert back.environment.on_gpu
    doc["source"], doc["ranks"][0]["environment"]["device"] = "a_newer_source", "xpu"
    newer = RunProfile.from_dict(doc)  # a newer pitstop's words are kept as written, never refused
    assert newer.source == "a_newer_source" and newer.environment.device == "xpu"
    assert not newer.environment.on_gpu


def test_a_run_document_reads_back_its_source() -> None:
    doc = json.loads(json.dumps(diagnose(profile("cpu", steps())).to_dict()))
    doc["source"] = "check"
    assert read_run(doc).profile.source is Source.CHECK
    del doc["profile"]
    assert read_run(doc).profile.source is Source.CHECK


def test_document_ids_are_the_released_ones() -> None:
    """An id names a form readers accept forever: a refactor that moves a module must not move its id."""
    from pitstop import schemas

    assert (schemas.RUN, schemas.PROFILE, schemas.TUNE, schemas.PLAN) == (
        "pitstop.run/1",
        "pitstop.profile/1",
        "pitstop.tune/1",
        "pitstop.plan/1",
    )
    assert (schemas.HISTORY, schemas.DATA_STATS, schemas.DATA_PACK) == (
        "pitstop.history/1",
        "pitstop.data.stats/1",
        "pitstop.data.pack/1",
    )
