"""nvidia-smi logs whose recorder renamed the columns (``utilization_gpu_pct``, ``memory_used_mib``, ``gpu_id``):
columns mapped by meaning, units from their suffixes, and every refusal saying what kind of file it saw and what
it lacks. An idle GPU beside a busy one is said to be unused, its share weighed by the cards' peaks."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.conftest import require_shared

from pitstop.artifacts import IngestError
from pitstop.core.vocabulary import CauseId
from pitstop.diagnose import diagnose
from pitstop.ingest.detect import sniff
from pitstop.ingest.load import Inputs, load_run
from pitstop.ingest.nvidia_smi import _column_role, _meaning, looks_like_smi, read_smi

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu_logs"
BAIKAL = "gpu_runs/nvidia_smi/baikal__gpu_monitor.csv"


@pytest.mark.parametrize(
    ("header", "role"),
    [
        ("utilization_gpu_pct", "util"),
        ("GPU Util (%)", "util"),
        ("gpu_util", "util"),
        ("utilization", "util"),
        ("utilization_mem_pct", None),  # the memory controller's busy share, never the GPU's
        ("memory_used_mib", "mem_used"),
        ("mem_used_mb", "mem_used"),
        ("memory_total_mib", "mem_total"),
        ("gpu_id", "index"),
        ("gpu", "index"),
        ("gpu_name", "name"),
        ("ts", "time"),
        ("power_draw_w", "power"),
        ("temperature_gpu_c", None),
        ("start_timestamp", None),
        ("fb_used_mean", None),  # a summary's mean, not a sample
    ],
)
def test_columns_by_meaning(header: str, role: str | None) -> None:
    assert _column_role(header) == role


def test_units_from_suffixes() -> None:
    assert _meaning("memory_used_mib") == ("memory_used", "mib")
    assert _meaning("mem_used_mb") == ("mem_used", "mb")
    assert _meaning("utilization_gpu_pct") == ("utilization_gpu", "pct")
    assert _meaning("power_draw_w") == ("power_draw", "w")


def test_renamed_columns_read_with_their_units() -> None:
    path = FIXTURES / "smi_renamed_mb.csv"
    assert sniff(path)[0] == "nvidia_smi"
    log = read_smi(path)
    gpu = log.gpus[0]
    assert gpu.key == "0" and gpu.name == "NVIDIA GeForce RTX 4090" and len(gpu.samples) == 40
    s = gpu.samples[0]
    assert s.util == 35 and s.power_w == 200
    assert s.mem_used == pytest.approx(9000e6, rel=1e-6)  # _mb: decimal megabytes, as the suffix says
    assert s.mem_total == pytest.approx(24000e6, rel=1e-6)
    assert log.interval_s == 1.0
    d = diagnose(load_run(Inputs(paths=[path])))
    small = next(f for f in d.findings if f.cause == CauseId.SMALL_BATCH)
    assert small.evidence["gpu_mem_used_frac"] == pytest.approx(9039 / 24000, abs=0.001)  # the peak


def test_refusal_names_the_file_kind_and_what_it_lacks(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("timestamp,gpu_id,temperature_gpu_c,fan_speed_pct\n2026/03/28 07:01:15.523,0,42,30\n")
    with pytest.raises(IngestError) as err:
        load_run(Inputs(paths=[path]))
    msg = str(err.value)
    assert "a CSV with columns timestamp, gpu_id, temperature_gpu_c, fan_speed_pct" in msg
    assert "no utilization column (looked for utilization.gpu" in msg and "memory_used_mib" in msg
    assert "\n" not in msg
    other = tmp_path / "a.csv"
    other.write_text("a,b,c\n1,2,3\n4,5,6\n")
    with pytest.raises(IngestError, match=r"a CSV with columns a, b, c: .*no utilization column"):
        load_run(Inputs(paths=[other]))


def test_recorder_header_detected_without_nvidia_smi_names() -> None:
    assert looks_like_smi("gpu,util,mem_used_mib\n0,40,1000\n")
    assert not looks_like_smi("a,b,c\n1,2,3\n")


def test_idle_card_of_another_model_not_weighed_as_the_busy_one(tmp_path: Path) -> None:
    """Two RTX 4090s, one idle: ×2 by count. An A100 idle beside an H100: weighed by their peaks, not ×2.
    A card not in the table: the speed-up is unknown."""

    def log(names: tuple[str, str]) -> Path:
        rows = ["timestamp,index,name,utilization.gpu [%],memory.used [MiB],memory.total [MiB]"]
        for i in range(30):
            t = f"2026/03/28 07:00:{i:02d}.000"
            rows.append(f"{t},0,{names[0]},{90 + i % 5} %,20000 MiB,81559 MiB")
            rows.append(f"{t},1,{names[1]},0 %,2 MiB,40960 MiB")
        path = tmp_path / f"{names[1].replace(' ', '_')}.csv"
        path.write_text("\n".join(rows) + "\n")
        return path

    def idle(path: Path) -> object:
        return next(
            f for f in diagnose(load_run(Inputs(paths=[path]))).findings if f.cause == CauseId.IDLE_GPU
        )

    same = idle(log(("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090")))
    assert same.est_speedup == pytest.approx(2.0)  # type: ignore[attr-defined]
    mixed = idle(log(("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB")))
    from pitstop.hardware import lookup_gpu

    h100, a100 = lookup_gpu("NVIDIA H100 80GB HBM3"), lookup_gpu("NVIDIA A100-SXM4-40GB")
    assert h100 is not None and a100 is not None
    expect = (h100.peak_tflops["bf16"] + a100.peak_tflops["bf16"]) / h100.peak_tflops["bf16"]  # type: ignore[operator]
    assert mixed.est_speedup == pytest.approx(expect, rel=0.01) and mixed.est_speedup < 2  # type: ignore[attr-defined]
    assert "is unused" in mixed.summary  # type: ignore[attr-defined]
    unknown = idle(log(("NVIDIA GeForce RTX 4090", "Some Vendor XPU 9000")))
    assert unknown.est_speedup is None and "not in pitstop's GPU table" in unknown.speedup_basis  # type: ignore[attr-defined]


def test_real_baikal_log_renamed_columns_and_the_unused_4080() -> None:
    """RTX 4090 + RTX 4080, a single-GPU script: before, refused as 'no utilization or memory column'."""
    path = require_shared(BAIKAL)
    log = read_smi(path)
    assert [g.name for g in log.gpus] == ["NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4080"]
    assert log.interval_s == pytest.approx(30.0, abs=0.1)
    assert log.gpus[0].samples[0].mem_total == 24564 * 2**20
    d = diagnose(load_run(Inputs(paths=[path])))
    idle = next(f for f in d.findings if f.cause == CauseId.IDLE_GPU)
    assert idle.evidence["idle_gpus"] == [1] and "RTX 4080" in idle.summary and "is unused" in idle.summary
    assert idle.est_speedup is None or idle.est_speedup < 2.0  # never as if the 4080 were a second 4090
    small = next(f for f in d.findings if f.cause == CauseId.SMALL_BATCH)
    assert small.evidence["idle_gpus_left_out"] == [1]
    assert small.evidence["gpu_util_active"] == pytest.approx(0.523, abs=0.01)
