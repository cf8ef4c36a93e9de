"""Per-GPU utilization inside the job's active time: nvidia-smi logs shaped like the cases that misled
pitstop (an unused GPU averaged into another cause; idle stretches averaged into a batch-size verdict)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from html import escape
from pathlib import Path

import pytest

from pitstop.diagnose import Diagnosis, diagnose
from pitstop.ingest.load import Inputs, load_run
from pitstop.report.html import render_html

HEADER = "timestamp, index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB]"
H100 = "NVIDIA H100 80GB HBM3"
T0 = datetime(2026, 1, 3, 10, 0, 0)


def _write(tmp_path: Path, gpus: list[list[float]], name: str = "gpus.csv") -> Path:
    """One row per GPU per second, interleaved as nvidia-smi writes them."""
    rows = [HEADER]
    for i in range(max(len(u) for u in gpus)):
        stamp = (T0 + timedelta(seconds=i)).strftime("%Y/%m/%d %H:%M:%S.000")
        for gpu, utils in enumerate(gpus):
            util = utils[i]
            rows.append(f"{stamp}, {gpu}, {H100}, {util:.0f} %, {30000 if util else 900} MiB, 81559 MiB")
    path = tmp_path / name
    path.write_text("\n".join(rows) + "\n")
    return path


def _busy(n: int, mean: float = 91.0, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [float(round(min(100.0, max(20.0, rng.gauss(mean, 6.0))))) for _ in range(n)]  # whole % as logged


def _diagnose(*paths: Path) -> Diagnosis:
    return diagnose(load_run(Inputs(paths=list(paths))))


def _causes(d: Diagnosis) -> list[str]:
    return [f.cause for f in d.findings]


def _finding(d: Diagnosis, cause: str):  # type: ignore[no-untyped-def]
    return next(f for f in d.findings if f.cause == cause)


def test_an_unused_second_gpu_is_idle_gpu_not_a_small_batch(tmp_path: Path) -> None:
    busy = _busy(600)
    d = _diagnose(_write(tmp_path, [busy, [0.0] * 600]))
    assert d.metrics.gpu_util == pytest.approx(sum(busy) / 1200 / 100)  # the plain mean: about 46%
    assert d.metrics.gpu_util_active == pytest.approx(sum(busy) / 600 / 100)  # GPU 0 alone: about 91%
    assert d.metrics.gpus_never_busy == 1
    assert _causes(d)[0] == "idle_gpu" and "small_batch" not in _causes(d)
    idle = _finding(d, "idle_gpu")
    assert idle.severity == "high" and idle.est_speedup == pytest.approx(2.0)
    assert idle.evidence["idle_gpus"] == [1] and idle.evidence["busy_gpus"] == [0]
    assert idle.evidence["active_util_pct"] == {"0": pytest.approx(sum(busy) / 600, abs=0.05)}


def test_the_real_busy_log_beside_an_idle_gpu(shared_data: Path, tmp_path: Path) -> None:
    """The shared RTX 4090 log as GPU 0, and a GPU 1 that never works, interleaved row by row."""
    lines = next((shared_data / "nvidia_smi").glob("*.csv")).read_text().splitlines()
    header, rows = lines[0], lines[1:]
    head = [c.strip() for c in header.split(",")]
    out = [", ".join([head[0], "index", *head[1:]])]
    for row in rows:
        cells = [c.strip() for c in row.split(",")]
        out.append(", ".join([cells[0], "0", *cells[1:]]))
        out.append(", ".join([cells[0], "1", cells[1], "0 %", "0 %", "3 MiB", "21.00 W"]))
    path = tmp_path / "two.csv"
    path.write_text("\n".join(out) + "\n")
    d = _diagnose(path)
    assert d.metrics.gpu_util == pytest.approx(0.415, abs=0.001)  # what small_batch used to read
    assert d.metrics.gpu_util_active == pytest.approx(0.847, abs=0.001)  # GPU 0 while it computed
    assert _causes(d) == ["idle_gpu"]
    assert _finding(d, "idle_gpu").evidence["mean_util_pct"] == {"0": 83.0, "1": 0.0}


def _spliced(shared_data: Path) -> list[float]:
    """The shared log's busy body behind a 15-minute idle lead-in, with a 4-minute idle pause after every
    5 minutes of work (as an evaluation or a checkpoint every few hundred steps would leave it)."""
    lines = next((shared_data / "nvidia_smi").glob("*.csv")).read_text().splitlines()[1:]
    body = [float(row.split(",")[2].strip().split()[0]) for row in lines][4:2540]
    out = [0.0] * 900
    for i, util in enumerate(body):
        out.append(util)
        if i % 300 == 299:
            out += [0.0] * 240
    return out


def test_idle_stretches_are_pauses_not_an_underfilled_gpu(shared_data: Path, tmp_path: Path) -> None:
    utils = _spliced(shared_data)
    d = _diagnose(_write(tmp_path, [utils]))
    assert d.metrics.gpu_util == pytest.approx(sum(utils) / len(utils) / 100)  # about 40%: misleading
    assert d.metrics.gpu_util_active == pytest.approx(0.85, abs=0.01)  # while the job computed
    assert d.metrics.gpu_active_frac == pytest.approx(0.47, abs=0.01)
    (window,) = d.results.gpus
    assert window.lead_in_s == pytest.approx(900) and len(window.pauses) == 8
    assert [p.duration_s for p in window.pauses] == [240.0] * 8
    assert window.pause_period_s == pytest.approx(540.0)
    assert _causes(d) == ["eval_overhead"]  # no small_batch, no input-pipeline "dips"
    f = _finding(d, "eval_overhead")
    assert f.severity == "medium" and f.confidence == pytest.approx(0.4)
    assert f.evidence["pauses"] == 8 and f.evidence["pause_s"] == 240.0
    assert f.evidence["pause_period_s"] == 540.0
    running = 900 + 2536 + 8 * 240 - 900  # from the first busy sample on: the body and its pauses
    assert f.evidence["pause_frac"] == pytest.approx(8 * 240 / running, abs=0.001)
    assert any("first 15.0 min" in n and "loading" in n for n in d.notes)
    assert any("paused 8 times, 32.0 min in all" in n and "periodic" in n for n in d.notes)
    html = render_html(d.to_dict())  # the page says what the terminal says
    assert all(escape(n) in html for n in d.notes)


def test_a_mostly_idle_log_does_not_claim_a_small_batch(tmp_path: Path) -> None:
    """The "busy only 6%, est. ×4.00" case: long irregular stretches at 0% around short busy ones."""
    utils = [0.0] * 3200
    for busy, idle in ((200, 1500), (150, 2600), (250, 900)):
        utils += _busy(busy, 88.0, seed=busy) + [0.0] * idle
    d = _diagnose(_write(tmp_path, [utils]))
    assert d.metrics.gpu_util == pytest.approx(0.06, abs=0.01)
    assert d.metrics.gpu_util_active == pytest.approx(0.88, abs=0.02)
    assert "small_batch" not in _causes(d)
    (window,) = d.results.gpus
    assert window.pause_period_s is None and len(window.pauses) == 2 and window.lead_in_s == 3200
    assert "eval_overhead" not in _causes(d)  # irregular pauses: reported, not named
    assert any("paused 2 times" in n and "periodic" not in n for n in d.notes)


def test_an_underfilled_gpu_is_judged_over_its_active_time(tmp_path: Path) -> None:
    utils = [0.0] * 600 + _busy(1200, 45.0, seed=3)  # ten minutes of loading, then 45% busy
    d = _diagnose(_write(tmp_path, [utils]))
    f = _finding(d, "small_batch")
    active = sum(utils[600:]) / 1200 / 100
    assert f.evidence["gpu_util_active"] == pytest.approx(active, abs=0.001)
    assert f.evidence["gpu_util"] == pytest.approx(active * 2 / 3, abs=0.001)  # the whole-log mean
    assert f.est_speedup == pytest.approx(1 / active, rel=0.01)
    assert f"busy only {active:.0%} while the job computes" in f.summary
    assert f.severity == "medium"  # 55% idle while computing (the whole-log 70% would have said high)
    assert f.evidence["gpu_util_active_per_gpu"] == {"0": pytest.approx(active, abs=0.001)}


def test_two_underfilled_gpus_and_an_unused_one(tmp_path: Path) -> None:
    a, b = _busy(900, 40.0, seed=1), _busy(900, 50.0, seed=2)
    d = _diagnose(_write(tmp_path, [a, b, [0.0] * 900]))
    # both named; the measured idle GPU (confidence 0.85) outranks the log-based small batch (0.4):
    # findings are ordered by confidence × estimated saving
    assert _causes(d)[:2] == ["idle_gpu", "small_batch"]
    small = _finding(d, "small_batch")
    per_gpu = small.evidence["gpu_util_active_per_gpu"]
    assert per_gpu == {
        "0": pytest.approx(sum(a) / 90000, abs=0.001),
        "1": pytest.approx(sum(b) / 90000, abs=0.001),
    }
    assert small.evidence["idle_gpus_left_out"] == [2]
    assert small.evidence["gpu_util_active"] == pytest.approx((sum(a) + sum(b)) / 180000, abs=0.001)
    assert "(mean of GPUs 0, 1)" in small.summary
    assert _finding(d, "idle_gpu").est_speedup == pytest.approx(1.5)
