"""metric_sync planted in real two-rank trainings (torchrun, gloo) under `pitstop doctor`: a DDP loop that
all-reduces eight logged metrics and reads each back with .item() every step, the same loop reducing every
50 steps, a Hugging Face Trainer with include_num_input_tokens_seen=True and 4 micro-batches a step, and a
Lightning DDP module that logs with sync_dist=True. pitstop names the loop's own line, the Trainer's line and
its setting (not the Trainer's gather that feeds the loss, average_tokens_across_devices), or the
training_step line that called self.log and the setting, and the job computes the same losses as without
pitstop; switching
the Trainer's setting off (tune's trial) leaves every micro-batch's loss bit-identical. The asserts are on
which cause and what evidence, not on a share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, causes, doctor

pytestmark = pytest.mark.slow

TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2")
LOOP = SCRIPTS / "metric_sync_loop.py"
TRAINER = SCRIPTS / "trainer_tokens_seen.py"
LIGHTNING = SCRIPTS / "lightning_sync_dist.py"


def _line_of(script: Path, text: str) -> int:
    return next(i for i, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def _rank_lines(prefix: Path) -> list[list[str]]:
    return [Path(f"{prefix}.rank{rank}").read_text().splitlines() for rank in (0, 1)]


def test_a_loops_metric_reduces_every_step_are_named_with_their_line_and_losses_unchanged(
    tmp_path: Path,
) -> None:
    probed, plain = tmp_path / "probed", tmp_path / "plain"
    doc, _ = doctor(tmp_path, *TORCHRUN, str(LOOP), "--steps", "40", "--losses", str(probed), steps=8)
    f = next(f for f in doc["findings"] if f["cause"] == "metric_sync")
    ev = f["evidence"]
    (site,) = ev["sites"]
    assert (
        site["site"] == f"{LOOP}:{_line_of(LOOP, 'dist.all_reduce(value)')} in main" and site["via"] is None
    )
    assert site["calls_per_step"] == 8 and site["ops"] == ["all_reduce"] and site["bytes_per_call"] == 4
    assert site["steps_with"] == ev["steps_measured"] == 8 and ev["ranks"] == 2 and ev["settings"] == []
    assert ev["blocked_ms_per_step"] > 0 and f["est_speedup"] > 1.0 and f["confidence"] == 0.75
    assert f["fix"]["remedies"][0]["id"] == "sync_metrics_less" and site["site"] in f["fix"]["text"]
    # DDP's own gradient bucket and buffer broadcast carry no line: they are not the job's metrics
    ranks = doc["profile"]["ranks"]
    assert all(c["site"] is None for r in ranks for c in r["collectives"] if c["source"] == "ddp")
    # the collector hands every call on: each rank computes the same losses as without pitstop
    subprocess.run([*TORCHRUN, str(LOOP), "--steps", "12", "--losses", str(plain)], check=True, timeout=300)
    for seen, alone in zip(_rank_lines(probed), _rank_lines(plain), strict=True):
        n = min(len(seen), len(alone))
        assert n >= 8 and seen[:n] == alone[:n]


def test_the_same_loop_reducing_every_fifty_steps_is_not_flagged(tmp_path: Path) -> None:
    doc, _ = doctor(tmp_path, *TORCHRUN, str(LOOP), "--every", "50", steps=8)
    assert "metric_sync" not in causes(doc)
    python = [c for r in doc["profile"]["ranks"] for c in r["collectives"] if c["source"] == "python"]
    assert python == []  # steps 4-11: no logging step in the window


def test_the_trainers_token_count_is_named_by_its_setting(tmp_path: Path) -> None:
    doc, _ = doctor(tmp_path, *TORCHRUN, str(TRAINER), steps=8)
    f = next(f for f in doc["findings"] if f["cause"] == "metric_sync")
    ev = f["evidence"]
    assert ev["settings"] == ["include_num_input_tokens_seen=True"] and f["confidence"] == 0.9
    (site,) = ev["sites"]
    assert site["site"].startswith("transformers/trainer.py:")
    assert site["site"].endswith(" in Trainer._track_num_input_tokens")
    assert site["via"] == "accelerate:Accelerator.gather" and site["ops"] == ["all_gather"]
    assert site["calls_per_step"] == 4  # one gather per micro-batch
    assert "include_num_input_tokens_seen=True" in f["summary"]
    assert "include_num_input_tokens_seen=False" in f["fix"]["text"]
    # the Trainer's other per-step gather feeds the loss (average_tokens_across_devices): seen, not flagged
    sites = {c["site"] for r in doc["profile"]["ranks"] for c in r["collectives"] if c["site"]}
    assert any(s.endswith(" in Trainer._get_num_items_in_batch") for s in sites)


def test_switching_the_setting_off_leaves_every_loss_bit_identical_and_unflagged(tmp_path: Path) -> None:
    on, off = tmp_path / "on", tmp_path / "off"
    for prefix, setting in ((on, "all"), (off, "no")):
        subprocess.run(
            [*TORCHRUN, str(TRAINER), "--steps", "4", "--tokens-seen", setting, "--losses", str(prefix)],
            check=True,
            capture_output=True,
            timeout=300,
        )
    for a, b in zip(_rank_lines(on), _rank_lines(off), strict=True):
        assert len(a) == 16 and a == b  # 4 steps of 4 micro-batches
    doc, _ = doctor(tmp_path, *TORCHRUN, str(TRAINER), "--tokens-seen", "no", steps=8)
    assert "metric_sync" not in causes(doc)


def test_lightnings_sync_dist_is_named_at_the_training_steps_log_line(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    doc, _ = doctor(tmp_path, *TORCHRUN, str(LIGHTNING), steps=8)
    f = next(f for f in doc["findings"] if f["cause"] == "metric_sync")
    ev = f["evidence"]
    assert ev["settings"] == ["self.log(..., sync_dist=True)"] and f["confidence"] == 0.9
    (site,) = ev["sites"]
    line = _line_of(LIGHTNING, 'self.log(f"train/m')
    assert site["site"] == f"{LIGHTNING}:{line} in Module.training_step"
    assert site["via"] == "lightning:LightningModule.log"
    assert site["ops"] == ["all_reduce", "barrier"] and site["calls_per_step"] == 8  # a barrier before each
    assert "sync_dist=False" in f["fix"]["snippets"]["lightning"]
    # Lightning builds DistributedDataParallel(module=...): its gradient buckets are timed as DDP's
    assert any(c["source"] == "ddp" for r in doc["profile"]["ranks"] for c in r["collectives"])
