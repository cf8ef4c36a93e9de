"""sharding_overhead planted in real two-rank jobs (torchrun, gloo, CPU): 64 small blocks (387 parameter
tensors, all small), each its own FSDP unit, a model a full replica of which fits many times over. pitstop
times FSDP's hooks, counts the collectives (one per unit and pass: 194 a step against DDP's one bucket) and
names the fix; the same model under plain DDP is not flagged. The asserts are on which cause and what evidence
(counts), not on a share; the step times of FSDP and DDP are printed for the calibration notes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, causes, doctor

pytestmark = pytest.mark.slow

TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2")
SCRIPT = SCRIPTS / "fsdp_small_tensors.py"
ENV = {"OMP_NUM_THREADS": "1"}


def _step_ms(doc: dict) -> float:  # type: ignore[type-arg]
    rank = doc["profile"]["ranks"][0]
    return sum(s["wall_s"] for s in rank["steps"]) / len(rank["steps"]) * 1000


@pytest.mark.parametrize("wrap", ["fsdp2", "fsdp1"])
def test_fsdp_units_of_small_tensors_where_ddp_fits_are_named(tmp_path: Path, wrap: str) -> None:
    doc, _ = doctor(tmp_path, *TORCHRUN, str(SCRIPT), "--wrap", wrap, steps=6, env=ENV)
    f = next(f for f in doc["findings"] if f["cause"] == "sharding_overhead")
    ev = f["evidence"]
    assert ev["sharded_by"] == wrap and ev["strategy"] == "full_shard" and ev["world_size"] == 2
    assert ev["param_tensors"] == 64 * 6 + 3 and ev["small_tensors"] == ev["param_tensors"]
    assert ev["units"] == 65  # each block and the root
    # each unit all-gathers for the forward and the backward (the root keeps its gather) and reduce-scatters
    assert ev["collectives_per_step"] == 194 and ev["ddp_buckets_est"] == 1
    assert ev["hook_ms_per_step"] > 0 and ev["saved_ms_per_step_est"] > 0
    assert ev["fit_basis"] == "model states only (shape unknown)"
    assert ev["plan_gib_per_rank"]["ddp"] < 0.01
    # gloo has no link reference: DDP's one bucket is priced at the job's own cost of a collective
    assert str(ev["ddp_link"]).startswith("the job's own ") and "a collective" in str(ev["ddp_link"])
    assert f["est_speedup"] > 1.0 and f["confidence"] == 0.75
    assert f["fix"]["remedies"][0]["id"] == "plain_ddp"
    assert "DistributedDataParallel(model" in f["fix"]["snippets"]["pytorch"]
    for rank in doc["profile"]["ranks"]:
        sharding = rank["sharding"]
        assert sharding["framework"] == wrap and sharding["hook_calls"] > 0 and sharding["steps"] == 6
        assert (
            rank["environment"]["fsdp_sharding"] == "full_shard"
        )  # the plain loop's FSDP, seen by the probe
    print(
        f"\n{wrap}: {_step_ms(doc):.1f} ms a step, estimated ×{f['est_speedup']:.2f} ({f['speedup_basis']})"
    )


def test_the_same_model_under_plain_ddp_is_not_flagged(tmp_path: Path) -> None:
    ddp, _ = doctor(tmp_path, *TORCHRUN, str(SCRIPT), "--wrap", "ddp", steps=6, env=ENV)
    assert "sharding_overhead" not in causes(ddp)
    for rank in ddp["profile"]["ranks"]:
        assert rank["sharding"] is None and rank["environment"]["fsdp_sharding"] is None
        assert (
            sum(s["collectives"] for s in rank["steps"]) / len(rank["steps"]) <= 2
        )  # one bucket (+ buffers)
    print(f"\nddp: {_step_ms(ddp):.1f} ms a step (the A/B against the FSDP runs above)")
