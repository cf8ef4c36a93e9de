"""ddp_find_unused planted in real two-rank gloo DDP jobs under `pitstop doctor -- torchrun`: the job's own
``DDP(..., find_unused_parameters=True)`` with every parameter used (named with its line, the probe leaves the
losses unchanged), the same with the search off or with a parameter some rank leaves unused (not flagged), a
Transformers Trainer on two ranks with its default (named as the Trainer's default), and tune's trial, which
builds the wrapper without the search and trains the same losses. The asserts are on which cause and what
evidence; the search's cost (a few percent of these steps) is never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, causes, doctor

pytestmark = pytest.mark.slow

TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2")
SCRIPT = SCRIPTS / "ddp_unused.py"
TRAINER = SCRIPTS / "hf_trainer.py"


def _line_of(script: Path, text: str) -> int:
    return next(i for i, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def _ddp(doc: dict, rank: int) -> dict:  # type: ignore[type-arg]
    return next(r for r in doc["profile"]["ranks"] if r["rank"] == rank)["ddp"]


def test_a_search_left_on_is_named_with_its_line_and_the_losses_are_unchanged(tmp_path: Path) -> None:
    probed, plain = tmp_path / "probed", tmp_path / "plain"
    doc, _ = doctor(tmp_path, *TORCHRUN, str(SCRIPT), "--losses", str(probed), steps=8)
    f = next(f for f in doc["findings"] if f["cause"] == "ddp_find_unused")
    ev = f["evidence"]
    assert ev["unused_parameters"] == 0 and ev["parameters"] == 96 * 6 + 3 and ev["ranks_searching"] == 2
    assert ev["set_by"] == "DistributedDataParallel(find_unused_parameters=True)"
    assert ev["site"] == f"{SCRIPT}:{_line_of(SCRIPT, 'DistributedDataParallel(inner')}"
    assert ev["search_ms_per_step"] > 0 and f["est_speedup"] > 1.0 and f["confidence"] >= 0.9
    assert f["fix"]["remedies"][0]["id"] == "no_unused_search" and ev["site"] in f["fix"]["text"]
    for rank in (0, 1):
        assert _ddp(doc, rank)["searches"] == 8
    # the collector hands every DDP call on: each rank computes the same losses as without pitstop
    subprocess.run(
        [*TORCHRUN, str(SCRIPT), "--steps", "40", "--losses", str(plain)],  # past where pitstop stops it
        check=True,
        capture_output=True,
        timeout=300,
    )
    for rank in (0, 1):
        seen = Path(f"{probed}.rank{rank}").read_text().splitlines()
        alone = Path(f"{plain}.rank{rank}").read_text().splitlines()
        n = min(len(seen), len(alone))  # pitstop stops the job after its window: later on a busy machine
        assert n >= 11 and seen[:n] == alone[:n]


def test_the_search_switched_off_is_not_flagged(tmp_path: Path) -> None:
    doc, _ = doctor(tmp_path, *TORCHRUN, str(SCRIPT), "--find-unused", "off", steps=6)
    assert "ddp_find_unused" not in causes(doc)
    ddp = _ddp(doc, 0)
    assert ddp["find_unused_parameters"] is False and ddp["unused_parameters"] is None


@pytest.mark.parametrize("unused", ["all", "rank1"])
def test_a_parameter_some_rank_leaves_unused_keeps_the_search(tmp_path: Path, unused: str) -> None:
    """``all``: a spare head no rank uses; ``rank1``: rank 0 uses it, rank 1 does not (DDP's all-reduced map
    says so on both ranks: the search is needed on the rank that skips it)."""
    doc, _ = doctor(tmp_path, *TORCHRUN, str(SCRIPT), "--unused", unused, steps=6)
    assert "ddp_find_unused" not in causes(doc)
    for rank in (0, 1):
        ddp = _ddp(doc, rank)
        assert ddp["find_unused_parameters"] is True
        assert ddp["unused_parameters"] == 2 and ddp["unused_names"] == ["spare.weight", "spare.bias"]


def test_a_trainer_on_two_ranks_is_named_by_its_default(tmp_path: Path) -> None:
    doc, _ = doctor(
        tmp_path,
        *TORCHRUN,
        str(TRAINER),
        "--steps",
        "40",
        "--batch",
        "4",
        steps=6,
        env={"OMP_NUM_THREADS": "1"},
    )
    f = next(f for f in doc["findings"] if f["cause"] == "ddp_find_unused")
    ev = f["evidence"]
    assert ev["set_by"].startswith("the Trainer's default (ddp_find_unused_parameters=None")
    assert ev["site"] == f"{TRAINER}:{_line_of(TRAINER, 'trainer.train()')}"
    assert ev["unused_parameters"] == 0 and ev["parameters"] == 21  # every weight of the tiny Llama
    assert "ddp_find_unused_parameters=False" in f["fix"]["snippets"]["hf_trainer"]
    assert "the Trainer's default" in f["summary"]


def test_the_trial_builds_the_wrapper_without_the_search_and_trains_the_same_losses() -> None:
    from pitstop.trials.request import FixRequest
    from pitstop.tune.window import run_window

    command = [*TORCHRUN, str(SCRIPT)]
    base = run_window(command, FixRequest(loss_steps=6), steps=6, warmup=2, timeout_s=300)
    fixed = run_window(
        command,
        FixRequest(fixes=frozenset({"no_unused_search"}), loss_steps=6),
        steps=6,
        warmup=2,
        timeout_s=300,
    )
    assert "find_unused_parameters=False" in fixed.applied["no_unused_search"]
    assert fixed.diagnosis is not None and base.diagnosis is not None
    assert all(
        r.ddp is not None and r.ddp.find_unused_parameters is False for r in fixed.diagnosis.profile.ranks
    )
    assert all(
        r.ddp is not None and r.ddp.find_unused_parameters is True for r in base.diagnosis.profile.ranks
    )
    assert len(base.losses) == 6 and fixed.losses == base.losses  # two ranks: the same sums, bit for bit
