"""The fuzz harness in the normal test run: a bounded number of cases (PITSTOP_FUZZ_CASES, default 200
in-process, plus the special shapes and PITSTOP_FUZZ_CLI cases through the real CLI). The long run on demand:
``python -m tests.fuzz --cases 5000``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fuzz import harness

CASES = int(os.environ.get("PITSTOP_FUZZ_CASES", "200"))
CLI = int(os.environ.get("PITSTOP_FUZZ_CLI", "10"))
SEED = int(os.environ.get("PITSTOP_FUZZ_SEED", "0"))


@pytest.mark.slow
def test_fuzzed_inputs_end_in_a_result_or_one_line() -> None:
    summary = harness.run(CASES, SEED, quick=CASES <= 500, cli_cases=CLI)
    report = "\n".join(summary.lines())
    print(report)
    assert summary.cases == CASES + CLI + len(harness.CLI_SPECIALS)
    assert summary.statuses.get("result", 0) > 0 and summary.statuses.get("refused", 0) > 0, report
    assert not summary.failures, report
    assert summary.worst_rss_mb <= harness.RSS_BOUND_MB, report
    assert not summary.trace_failures, report  # the trace reader's failures are failures too


def test_the_harness_catches_what_it_guards_against(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vacuous: an exception that is not a PitstopError, a multi-line message and a NaN in the result
    are each reported as failures."""
    import pitstop.ingest.load as load
    from pitstop.core.findings import Finding
    from pitstop.errors import PitstopError

    case = harness.Case(index=0, seed=str(harness.SEEDS / "trainer_state.json"))

    def key_error(*a: object, **k: object) -> None:
        raise KeyError("missing")

    monkeypatch.setattr(load, "load_run", key_error)
    assert harness.run_inprocess(case).status == "FAIL"

    def two_lines(*a: object, **k: object) -> None:
        raise PitstopError("first\nsecond")

    monkeypatch.setattr(load, "load_run", two_lines)
    assert harness.run_inprocess(case).status == "FAIL"
    monkeypatch.undo()

    def nan_confidence(self: Finding) -> dict[str, object]:
        return {"confidence": float("nan")}

    monkeypatch.setattr(Finding, "to_dict", nan_confidence)
    ok = harness.Case(index=0, seed=str(harness.SEEDS / "smi_header.csv"))
    assert harness.run_inprocess(ok).status == "FAIL"


def test_every_mutator_changes_its_input() -> None:
    import random

    data = (harness.SEEDS / "sft_args.json").read_bytes()
    for name, mutate in harness.MUTATORS.items():
        outputs = {mutate(data, random.Random(i)) for i in range(5)}
        assert outputs != {data}, name
    assert all(Path(p).is_file() for p in harness.seeds(quick=True))


@pytest.mark.parametrize("shape", harness.OUTPUT_SHAPES)
def test_every_output_shape_keeps_the_path_and_gets_the_document(shape: str) -> None:
    """``--json`` to a file, a link, a dangling link, standard output, a FIFO, a device node (as root), a name
    with markup or escape codes in it, and a folder (refused, exit 2), through ``main()`` in-process."""
    assert harness.run_output_inprocess(shape) is None


def test_the_output_check_catches_a_replaced_link(tmp_path: Path) -> None:
    """Not vacuous: a link replaced by a regular file (what the old rename did) is reported."""
    target = harness.output_target("symlink", tmp_path)
    assert target is not None
    link = Path(target.arg)
    link.unlink()
    link.write_text('{"schema": "pitstop.run/1"}')
    assert harness.output_problem(target, 0, b"", "") == "the link was replaced by a file"


def test_hostile_strings_reach_every_field_and_stay_valid_json() -> None:
    import json
    import random

    data = (harness.SEEDS / "sft_args.json").read_bytes()
    mutated = harness.hostile_strings(data, random.Random(1))
    before, after = json.loads(data), json.loads(mutated)
    assert set(after) == set(before)  # keys kept: the file is still recognized
    strings = [k for k, v in before.items() if isinstance(v, str)]
    assert strings and all(after[k] != before[k] and after[k].startswith(before[k]) for k in strings)
    assert all(after[k] == v for k, v in before.items() if not isinstance(v, str))


def test_a_markup_or_escape_string_in_every_field_prints_as_text() -> None:
    """Every seed with hostile strings in every field, in-process: a result or one line, and the terminal
    report with no control character and no MarkupError."""
    outcomes = [
        harness.run_inprocess(harness.Case(index=0, seed=str(p), mutators=["hostile_strings"]))
        for p in harness.seeds(quick=True)
    ]
    failures = [f"{o.case.seed}: {o.detail}" for o in outcomes if o.status == "FAIL"]
    assert not failures, "\n".join(failures)
    assert sum(o.status == "result" for o in outcomes) >= 3
