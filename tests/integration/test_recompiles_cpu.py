"""recompiles planted in a real torch.compile'd tiny Llama (backend aot_eager on a CPU) under `pitstop doctor`:
a sequence-length curriculum compiled with dynamic=False recompiles every few steps (named with its reason,
its compile seconds and the job's torch.compile line); the issue's repro (batches padded to their longest,
dynamic=False) reaches the recompile limit and the probe survives the compiled model; fixed shapes are no
finding and train the same losses as without pitstop. The trials: dynamic shapes stop the recompiles, buckets
cut them, both with the same losses. Asserts are on which cause and what evidence, never on a share near a
threshold: a compile costs seconds, a step of this model tens of milliseconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SCRIPTS, causes, doctor

pytestmark = pytest.mark.slow

SCRIPT = SCRIPTS / "compiled_loop.py"
CURRICULUM = ("--grow-every", "6", "--recompile-limit", "64")  # a new length every 6 steps, past the limit


def _line_of(text: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


def _recompiles(doc: dict[str, Any]) -> dict[str, Any]:
    return next(f for f in doc["findings"] if f["cause"] == "recompiles")


def test_a_length_curriculum_compiled_with_dynamic_false_is_found_with_its_reason_and_line(
    tmp_path: Path,
) -> None:
    doc, _ = doctor(tmp_path, sys.executable, str(SCRIPT), *CURRICULUM, warmup=3, steps=18)
    f = _recompiles(doc)
    ev = f["evidence"]
    assert ev["recompiles"] >= 2 and ev["steps_compiling"] >= 2 and ev["compile_s"] > 0
    assert ev["dynamic"] is False and ev["cache_limit_hit"] is False and ev["recompile_limit"] == 64
    assert "size mismatch at index 1" in ev["reasons"][0]
    assert ev["compile_site"] == f"{SCRIPT}:{_line_of('run = torch.compile(')}"
    assert f["est_speedup"] > 1.0 and f["confidence"] >= 0.9
    assert [r["id"] for r in f["fix"]["remedies"]] == ["dynamic_compile", "length_buckets"]
    assert "Drop dynamic=False" in f["fix"]["text"]


def test_the_issue_repro_reaches_the_recompile_limit_and_the_probe_survives(tmp_path: Path) -> None:
    """torch.compile(model, backend="aot_eager", dynamic=False), batches padded to their longest: the probe
    died here at the first step before issue 40; the limit (8) comes within the first twenty batches."""
    doc, proc = doctor(tmp_path, sys.executable, str(SCRIPT), warmup=16, steps=6)
    assert "probe disabled" not in proc.stderr
    f = _recompiles(doc)
    ev = f["evidence"]
    assert ev["cache_limit_hit"] is True and ev["recompile_limit"] == 8
    assert ev["limit_frame"] and "size mismatch at index 1" in ev["reasons"][0]
    assert f["est_speedup"] is None and "not measured" in f["speedup_basis"]


def test_fixed_shapes_are_no_finding_and_train_the_same_losses(tmp_path: Path) -> None:
    probed, plain = tmp_path / "probed.txt", tmp_path / "plain.txt"
    job = (
        "--pad-to",
        "128",
        "--module-compile",
        "--steps",
        "16",
    )  # nn.Module.compile(): torch.compile inside
    doc, _ = doctor(tmp_path, sys.executable, str(SCRIPT), *job, "--losses", str(probed), warmup=3, steps=8)
    assert "recompiles" not in causes(doc)
    stats = doc["profile"]["ranks"][0]["compile"]
    assert stats["recompiles"] == 0 and stats["compiles_before_window"] >= 1 and stats["dynamic"] is False
    assert stats["site"] == f"{SCRIPT}:{_line_of('model.compile(backend')}"
    # the collector wraps torch.compile and hands every call on: the job computes the same losses
    subprocess.run([sys.executable, str(SCRIPT), *job, "--losses", str(plain)], check=True)
    seen = probed.read_text().splitlines()
    assert len(seen) >= 8 and seen == plain.read_text().splitlines()[: len(seen)]


def test_the_trials_stop_the_recompiles_and_train_the_same_losses() -> None:
    from pitstop.trials.request import FixRequest
    from pitstop.tune.window import run_window

    command = [sys.executable, str(SCRIPT), "--grow-every", "2", "--recompile-limit", "64"]

    def window(*fixes: str):  # type: ignore[no-untyped-def]
        request = FixRequest(fixes=frozenset(fixes), loss_steps=6)
        return run_window(command, request, steps=6, warmup=2, timeout_s=600)

    base, dynamic, buckets = window(), window("dynamic_compile"), window("length_buckets")
    for w in (base, dynamic, buckets):
        assert w.ok and w.diagnosis is not None, w.error
    stats = [w.diagnosis.profile.ranks[0].compile for w in (base, dynamic, buckets) if w.diagnosis]
    assert stats[0] is not None and stats[0].recompiles >= 2
    assert "dynamic=True) in place of dynamic=False" in dynamic.applied["dynamic_compile"]
    assert stats[1] is not None and stats[1].recompiles == 0
    assert "bucket" in buckets.applied["length_buckets"]
    assert stats[2] is not None and stats[2].recompiles < stats[0].recompiles  # 32, 40, 48, ... in 3 buckets
    assert len(base.losses) == 6
    assert dynamic.losses == pytest.approx(base.losses, rel=1e-4)
    assert buckets.losses == pytest.approx(base.losses, rel=1e-4)


@pytest.mark.parametrize("what", ["layers", "loss"])
def test_compiled_layers_or_a_compiled_loss_are_measured_like_any_model(tmp_path: Path, what: str) -> None:
    """The probe works whatever is compiled (issue 40): each decoder layer compile()d in place, or only the
    loss function; the run is measured (no probe error), its compiles counted, and the losses are the job's."""
    probed, plain = tmp_path / "probed.txt", tmp_path / "plain.txt"
    job = ("--compile", what, "--pad-to", "128", "--steps", "16")
    doc, _ = doctor(tmp_path, sys.executable, str(SCRIPT), *job, "--losses", str(probed), warmup=3, steps=8)
    rank = doc["profile"]["ranks"][0]
    assert not rank["probe_errors"] and len(rank["steps"]) == 8
    assert rank["compile"]["compiles_before_window"] >= 1 and rank["compile"]["recompiles"] == 0
    assert rank["steps"][0]["tokens"] == 8 * 128  # the batches are counted as for an eager model
    subprocess.run([sys.executable, str(SCRIPT), *job, "--losses", str(plain)], check=True)
    seen = probed.read_text().splitlines()
    assert len(seen) >= 8 and seen == plain.read_text().splitlines()[: len(seen)]
