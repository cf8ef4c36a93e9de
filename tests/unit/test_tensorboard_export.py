"""TensorBoard export: written with the real writer, read back with TensorBoard's own reader."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from tests.factories import profile, steps

from pitstop.core.profile import GpuSample, RunProfile
from pitstop.diagnose import diagnose
from pitstop.report.errors import ReportError
from pitstop.report.tensorboard import MISSING_WRITER, export_tensorboard, write_tensorboard

GIB = 2**30


def _read(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of one TensorBoard run folder, as tag -> [(step, value)]."""
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _gpu_run(ranks: int = 1) -> RunProfile:
    """20 steps of 0.1 s after 10 warm-up steps; rank 0's window starts at t=1.0 s and has two NVML samples
    per step (util 0, 1 in the first step, 2, 3 in the second…), plus one in warm-up and one after."""
    records = steps(20, wall=0.1, rows=8, row_len=1024, real_frac=0.75)
    records[3].forward_s = None  # not measured in that step: no point, not a zero
    p = profile("cuda", records, util=50.0, ranks=ranks)
    rank = p.ranks[0]
    rank.window_start_t = 1.0
    rank.gpu_samples = [GpuSample(t=0.5, util=99.0)]
    rank.gpu_samples += [
        GpuSample(t=1.0 + 0.025 + 0.05 * i, util=float(i), mem_used=(i + 1) * GIB, pcie_rx=2e8)
        for i in range(40)
    ]
    rank.gpu_samples.append(GpuSample(t=3.5, util=99.0))
    return p


def test_run_document_reads_back_per_step(tmp_path: Path) -> None:
    doc = diagnose(_gpu_run()).to_dict()
    export = export_tensorboard(doc, tmp_path)
    assert export.path.parent == tmp_path and export.path.name.startswith("pitstop-test-")
    scalars = _read(export.path)

    assert [s for s, _ in scalars["pitstop/step_time_s"]] == list(range(11, 31))
    assert all(v == pytest.approx(0.1) for _, v in scalars["pitstop/step_time_s"])
    assert scalars["pitstop/real_tokens_per_s"][0] == (11, pytest.approx(6144 / 0.1))
    assert scalars["pitstop/tokens_per_s"][0] == (11, pytest.approx(8192 / 0.1))
    assert scalars["pitstop/padding_frac"][-1] == (30, pytest.approx(0.25))
    assert 14 not in [s for s, _ in scalars["pitstop/forward_s"]]
    assert len(scalars["pitstop/forward_s"]) == 19

    # samples are averaged into the step in progress; warm-up and after-window samples are left out
    util = scalars["pitstop/gpu_util"]
    assert [s for s, _ in util] == list(range(11, 31))
    assert util[:3] == [(11, 0.5), (12, 2.5), (13, 4.5)]
    assert scalars["pitstop/gpu_mem_used_gib"][0] == (11, pytest.approx(1.5))
    assert scalars["pitstop/pcie_rx_mb_s"][0] == (11, pytest.approx(200.0))
    assert "pitstop/power_w" not in scalars  # never sampled

    # summary figures at the last step, as the saved document has them
    metrics = doc["metrics"]
    assert scalars["pitstop/summary/real_tokens_per_s"] == [(30, pytest.approx(metrics["real_tokens_per_s"]))]
    assert metrics["mfu"] is not None
    assert scalars["pitstop/summary/mfu"] == [(30, pytest.approx(metrics["mfu"]))]
    assert export.scalars == sum(len(v) for v in scalars.values())


def test_other_ranks_are_runs_of_their_own(tmp_path: Path) -> None:
    doc = diagnose(_gpu_run(ranks=2)).to_dict()
    folder = export_tensorboard(doc, tmp_path).path
    assert (folder / "rank1").is_dir()
    rank1 = _read(folder / "rank1")
    assert [s for s, _ in rank1["pitstop/step_time_s"]] == list(range(11, 31))
    assert not any(tag.startswith("pitstop/summary/") for tag in rank1)
    # rank 1 has no window start: its samples cannot be placed on steps, so they go by sample index
    assert "pitstop/gpu_util" not in rank1
    assert rank1["pitstop/by_sample/gpu_util"][:2] == [(0, 50.0), (1, 50.0)]
    assert len(rank1["pitstop/by_sample/gpu_util"]) == 20
    assert "pitstop/by_sample/gpu_util" not in _read(folder)


def test_profile_document_is_accepted(tmp_path: Path) -> None:
    count = write_tensorboard(profile("cpu").to_dict(), tmp_path)
    (folder,) = tmp_path.iterdir()
    scalars = _read(folder)
    assert scalars["pitstop/step_time_s"][0] == (11, pytest.approx(0.1))
    assert "pitstop/gpu_util" not in scalars
    assert count == sum(len(v) for v in scalars.values())


def _tune_doc() -> dict[str, Any]:
    """Keys as TuneResult.to_dict writes them."""
    return {
        "schema": "pitstop.tune/1",
        "pitstop_version": "0.1.0",
        "command": ["python", "train.py"],
        "framework": "hf_trainer",
        "budget_s": 600.0,
        "elapsed_s": 321.0,
        "baseline": {
            "real_tokens_per_s": 1000.0,
            "spread": 0.02,
            "start": 1000.0,
            "end": 1010.0,
            "drift": 0.01,
            "losses": [2.0, 1.9, 1.8],
            "losses_reproducible": True,
        },
        "candidates": [
            {"fix": "pretokenize", "title": "t", "real_tokens_per_s": 1500.0, "speedup": 1.5, "kept": True},
            {"fix": "workers", "title": "t", "real_tokens_per_s": 1010.0, "speedup": 1.01, "kept": False},
            {"fix": "sdpa", "title": "t", "real_tokens_per_s": None, "speedup": None, "kept": False},
        ],
        "not_tried": [{"fix": "packing", "reason": "the time budget ran out"}],
        "best": {"fixes": ["pretokenize"], "real_tokens_per_s": 1600.0, "speedup": 1.6, "verified": True},
        "redirected_outputs": [],
        "notes": [],
        "baseline_run": diagnose(profile("cpu")).to_dict(),
    }


def test_tune_document_reads_back_at_step_zero(tmp_path: Path) -> None:
    export = export_tensorboard(_tune_doc(), tmp_path)
    assert export.path.name.startswith("pitstop-tune-")
    scalars = _read(export.path)
    assert scalars == {
        "pitstop_tune/baseline/real_tokens_per_s": [(0, 1000.0)],
        "pitstop_tune/baseline/speedup": [(0, 1.0)],
        "pitstop_tune/pretokenize/real_tokens_per_s": [(0, 1500.0)],
        "pitstop_tune/pretokenize/speedup": [(0, 1.5)],
        "pitstop_tune/workers/real_tokens_per_s": [(0, 1010.0)],
        "pitstop_tune/workers/speedup": [(0, pytest.approx(1.01))],
        "pitstop_tune/best/real_tokens_per_s": [(0, 1600.0)],
        "pitstop_tune/best/speedup": [(0, pytest.approx(1.6))],
    }
    assert export.scalars == 8


def test_each_export_gets_its_own_folder(tmp_path: Path) -> None:
    doc = _tune_doc()
    first = export_tensorboard(doc, tmp_path).path
    second = export_tensorboard(doc, tmp_path).path
    assert first != second and first.parent == second.parent == tmp_path


def test_not_a_pitstop_document(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match=r"schema: 'pitstop.plan/1'"):
        write_tensorboard({"schema": "pitstop.plan/1"}, tmp_path)
    assert not any(tmp_path.iterdir())


def test_without_a_writer_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("tensorboard.compat.proto", "tensorboard.summary.writer.event_file_writer", "tensorboardX"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name` fail
    with pytest.raises(ReportError) as err:
        write_tensorboard(_tune_doc(), tmp_path / "tb")
    assert str(err.value) == MISSING_WRITER
    assert "\n" not in str(err.value)
    assert not (tmp_path / "tb").exists()


def test_a_long_run_exports_in_linear_time(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    p = profile("cpu", steps(100_000))
    doc = {"schema": "pitstop.run/1", "source": "test", "metrics": {}, "profile": p.to_dict()}
    assert write_tensorboard(doc, tmp_path) == 100_000 * 8
