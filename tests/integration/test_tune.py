"""`pitstop tune` on real CPU training jobs: it finds and keeps the planted fixes with a measured speed-up,
rejects what does not help, survives a fix that crashes, and leaves nothing running."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SCRIPTS, require_shared, run_pitstop

pytestmark = pytest.mark.slow

WINDOW = ("--steps", "12", "--warmup", "3")


def tune(
    tmp_path: Path, *args: str, window: tuple[str, ...] = WINDOW
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    out = tmp_path / "tune.json"
    # one intra-op thread: beside two busy processes a job's two OpenMP threads wait for each other at
    # every parallel region (the demo ran 3x slower, ±30% a window, and no fix could be told from noise);
    # one thread is slowed evenly, ±3%
    proc = run_pitstop("tune", *window, "--json", str(out), *args, timeout=900, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text()), proc


def by_fix(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["fix"]: c for c in doc["candidates"]}


def assert_schema(doc: dict[str, Any]) -> None:
    assert doc["schema"] == "pitstop.tune/1"
    assert doc["baseline"]["real_tokens_per_s"] > 0 and doc["baseline"]["spread"] >= 0
    for c in doc["candidates"]:
        assert {"fix", "preserves_computation", "real_tokens_per_s", "speedup", "kept", "reason"} <= set(c)
    best = doc["best"]
    assert best is not None and best["speedup"] > 1.0 and best["verified"]
    assert {c["fix"] for c in best["changes"]} == set(best["fixes"])
    assert doc["baseline_run"]["schema"] == "pitstop.run/1"


def test_demo_plain_loop_text_collate_eager(tmp_path: Path, history_file: Path) -> None:
    """The demo: a plain PyTorch loop, eager attention, text tokenized in the collate, padded to max length."""
    # pretokenize is asked for: its finding (data wait ~9%) can fall under the threshold on a busy machine.
    # The fixes asserted on below, no others: pack_batch and workers would add two windows (and a baseline)
    # that nothing here reads; pack_batch is asserted in test_trainer_padded_to_max_length, workers' trial
    # in test_survives_a_crashing_fix_and_leaves_nothing_running. 24 steps a window: at 12, on a busy
    # machine, pack measured ×1.8 against trim_padding's ×2.0 and was not the best (×4.8 at 24)
    fixes_asserted = "trim_padding,pack,group_by_length,attention,pretokenize"
    window = ("--steps", "24", "--warmup", "3")
    doc, proc = tune(tmp_path, "--demo", "--try", "pretokenize", "--only", fixes_asserted, window=window)
    assert_schema(doc)
    fixes = by_fix(doc)
    # half of every row is padding and a tiny model's step has a large fixed cost: full rows win on a CPU
    pack = fixes["pack"]
    assert pack["kept"] and pack["speedup"] > 1.5, pack
    assert not pack["preserves_computation"] and "packed into" in pack["applied"]
    assert "pack" in doc["best"]["fixes"]
    assert fixes["trim_padding"]["loss_max_rel_diff"] < 1e-5
    # the cache is the job's own collate, run once per example before training: the same batches exactly
    assert fixes["pretokenize"]["loss_max_rel_diff"] == 0.0
    assert "examples collated once" in fixes["pretokenize"]["applied"]
    assert "attention" in fixes and fixes["attention"]["applied"] == "LlamaForCausalLM: eager → sdpa"
    assert fixes["attention"]["loss_max_rel_diff"] < 1e-3
    group = fixes["group_by_length"]
    assert group["status"] == "not applicable" and "token ids" in group["reason"]
    assert "pitstop tune: measured on your job" in proc.stdout
    assert "Keep:" in proc.stdout
    rows = sqlite3.connect(history_file).execute("select kind, real_tokens_per_s from runs").fetchall()
    assert rows == [("tune", pytest.approx(doc["best"]["real_tokens_per_s"]))]


def test_trainer_padded_to_max_length(tmp_path: Path) -> None:
    """A Hugging Face Trainer job padded to 256 tokens, micro-batch 2 × accumulation 4."""
    script = SCRIPTS / "hf_trainer.py"
    # the fixes asserted on below, no others: group_by_length cannot help rows padded to a fixed length
    # (test_survives_a_crashing_fix_and_leaves_nothing_running asserts that) and would add a window
    doc, _ = tune(
        tmp_path,
        "--only",
        "trim_padding,pack_batch,pack,micro_batch",
        "--",
        sys.executable,
        str(script),
        "--steps",
        "10000",
        "--pad-to",
        "256",
        "--batch",
        "2",
        "--accum",
        "4",
    )
    assert_schema(doc)
    fixes = by_fix(doc)
    assert doc["framework"] == "hf_trainer"
    padding = [fixes[f] for f in ("trim_padding", "pack_batch") if f in fixes]
    assert any(f["kept"] and f["speedup"] > 1.3 for f in padding), padding
    for f in padding:  # both keep the examples and labelled tokens of every batch
        assert f["loss_max_rel_diff"] < 1e-3, f
    micro = fixes["micro_batch"]
    assert micro["applied"] == "per_device_train_batch_size 2 → 8, gradient_accumulation_steps 4 → 1"
    assert micro["loss_max_rel_diff"] < 1e-3  # the Trainer's step loss does not depend on the split
    assert fixes["pack"]["kept"] and doc["best"]["speedup"] > 2.0
    changes = {c["fix"]: c["snippet"] for c in doc["best"]["changes"]}
    if "micro_batch" in changes:
        snippet = " ".join(changes["micro_batch"].split())  # the snippet may wrap its arguments
        assert "per_device_train_batch_size=8, gradient_accumulation_steps=1" in snippet
    assert any("output_dir" in line for line in doc["redirected_outputs"])


def test_survives_a_crashing_fix_and_leaves_nothing_running(tmp_path: Path) -> None:
    """Workers under the spawn start method must pickle the job's collate, a local function here: that
    trial crashes; tune records it and goes on. Eager attention and fixed-length padding are planted too."""
    marker = f"pitstop-tune-test-{tmp_path.name}"
    # the fixes asserted on below, no others: pack and pack_batch would add two windows nothing here reads
    doc, proc = tune(
        tmp_path,
        "--try",
        "workers",
        "--only",
        "trim_padding,group_by_length,workers,attention",
        "--",
        sys.executable,
        str(SCRIPTS / "plain_loop.py"),
        "--steps",
        "10000",
        "--attn",
        "eager",
        "--pad-to",
        "256",
        "--spawn",
        "--losses",
        str(tmp_path / marker),
    )
    fixes = by_fix(doc)
    # rows padded to a fixed length stay that long however they are grouped: alone, grouping cannot help
    # (undecided: on a busy machine the baselines around it disagreed by more than the run resolves)
    group = fixes["group_by_length"]
    assert not group["kept"] and group["status"] in ("within noise", "slower", "undecided"), group
    workers = fixes["workers"]
    assert workers["status"] == "failed" and "pickle" in workers["reason"], workers
    assert not workers["kept"] and workers["speedup"] is None
    assert fixes["trim_padding"]["kept"] and fixes["trim_padding"]["loss_max_rel_diff"] < 1e-3
    assert fixes["attention"]["applied"] == "LlamaForCausalLM: eager → sdpa"
    assert doc["framework"] == "pytorch"
    assert "workers: failed" in proc.stdout
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert left.stdout.strip() == "", "a trial process outlived pitstop tune"


@pytest.mark.smoke
def test_bad_input_is_one_line(tmp_path: Path) -> None:
    for args, message in (
        (("tune", "--budget", "soon", "--", "python", "x.py"), "--budget"),
        (("tune", "--try", "warp_drive", "--", "python", "x.py"), "unknown fix 'warp_drive'"),
        (("tune",), "no command given"),
        (("tune", "--", sys.executable, "-c", "raise SystemExit(3)"), "first window did not run"),
    ):
        proc = run_pitstop(*args)
        assert proc.returncode != 0
        lines = proc.stderr.strip().splitlines()
        assert message in lines[-1] and "Traceback" not in proc.stderr, proc.stderr


def test_a_trainer_script_written_without_pitstop(tmp_path: Path) -> None:
    """tests/scripts/external/hf_trainer_alpaca.py was written independently: a Trainer with
    DataCollatorForLanguageModeling (padding to each batch's longest). Grouping and packing cut padding.
    Sixteen rows up to 256 tokens are a third padding (est. ×1.5): at the script's defaults (4 × 128,
    13% padding) packing's gain was within a busy machine's noise and once measured ×0.93."""
    require_shared("datasets")
    # the fixes asserted on below, no others (pack_batch would add a window of ~40 s that nothing here reads;
    # test_trainer_padded_to_max_length asserts it on a Trainer)
    doc, _ = tune(
        tmp_path,
        "--only",
        "pack,group_by_length,trim_padding",
        "--",
        sys.executable,
        str(SCRIPTS / "external" / "hf_trainer_alpaca.py"),
        "--max-steps",
        "100000",
        "--batch-size",
        "16",
        "--max-length",
        "256",
    )
    fixes = by_fix(doc)
    assert doc["framework"] == "hf_trainer"
    assert (
        "examples packed into" in fixes["pack"]["applied"]
    )  # the collate's own pad id, learned from its batches
    assert "padding_waste (high)" in fixes["pack"]["why_tried"], fixes["pack"]
    for fix in ("pack", "group_by_length"):
        assert fixes[fix]["speedup"] > 1.0, fixes[fix]
    assert fixes["trim_padding"]["loss_max_rel_diff"] < 1e-3


def test_a_loop_without_a_dataloader_is_compared_on_tokens_from_its_model_inputs(tmp_path: Path) -> None:
    """nanoGPT's shape (its own get_batch(), model(X, Y)): tune runs and names what its rate counts."""
    script = SCRIPTS / "own_batches" / "nanogpt_loop.py"
    command = ("--", sys.executable, str(script), "--steps", "400")
    doc, proc = tune(tmp_path, *command, window=("--steps", "6", "--warmup", "2"))
    baseline = doc["baseline"]
    assert baseline["real_tokens_per_s"] > 0 and baseline["rate_of"] == "real tokens"
    assert baseline["counted_from"] == "model inputs"
    assert "tokens were counted from the model's inputs" in proc.stdout
