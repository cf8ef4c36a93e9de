"""The new causes that a CPU can produce, planted in real tiny trainings under `pitstop doctor`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import causes, doctor_json

pytestmark = pytest.mark.slow


def test_checkpoint_saved_every_other_step_is_a_stall(tmp_path: Path) -> None:
    # one torch thread, so the compute stays small beside a ~30 MB checkpoint even on a busy machine
    args = (
        "--save-every",
        "2",
        "--hidden",
        "256",
        "--batch",
        "1",
        "--short",
        "--threads",
        "1",
        "--steps",
        "100",
    )
    doc, _ = doctor_json(tmp_path, "cpu_causes.py", *args)
    assert "checkpoint_stall" in causes(doc)
    f = next(f for f in doc["findings"] if f["cause"] == "checkpoint_stall")
    ev = f["evidence"]
    assert ev["checkpoints"] == 6 and ev["steps_per_save"] == 2  # 12 measured steps
    assert ev["calls"] == {
        "save_pretrained": 6,
        "torch.save": 6,
    }  # safetensors inside save_pretrained: not twice
    assert ev["save_frac"] > 0.05
    assert "save" in f["fix"]["text"].lower()


def test_no_saves_no_stall(tmp_path: Path) -> None:
    doc, _ = doctor_json(
        tmp_path,
        "cpu_causes.py",
        "--hidden",
        "256",
        "--batch",
        "1",
        "--short",
        "--threads",
        "1",
        "--steps",
        "100",
    )
    assert "checkpoint_stall" not in causes(doc)
    assert doc["profile"]["ranks"][0]["checkpoints"]["saves"] == 0


def test_eight_threads_and_two_workers_oversubscribe_this_machines_cores(tmp_path: Path) -> None:
    import os

    cores = len(os.sched_getaffinity(0))
    threads = 4 * cores  # on the 2-core CI machine: 8 threads beside 2 workers
    doc, _ = doctor_json(
        tmp_path, "cpu_causes.py", "--threads", str(threads), "--workers", "2", "--steps", "100"
    )
    assert "cpu_oversubscribed" in causes(doc)
    f = next(f for f in doc["findings"] if f["cause"] == "cpu_oversubscribed")
    ev = f["evidence"]
    assert ev["torch_threads"] == threads and ev["dataloader_workers"] == 2
    assert ev["cores_allowed"] <= cores and ev["thread_demand"] > 1.25 * ev["cores_allowed"]
    assert ev["runnable_threads"] is not None and ev["runnable_threads"] >= 1  # sampled from /proc
    assert ev["suggested_threads"] < threads
    assert f"torch.set_num_threads({ev['suggested_threads']})" in f["fix"]["snippets"]["pytorch"]


def test_default_threads_are_not_oversubscribed(tmp_path: Path) -> None:
    doc, _ = doctor_json(tmp_path, "cpu_causes.py", "--steps", "100")
    assert "cpu_oversubscribed" not in causes(doc)
    cpu = doc["profile"]["ranks"][0]["environment"]["cpu"]
    assert cpu["torch_threads"] >= 1 and cpu["cores_allowed"] >= 1
