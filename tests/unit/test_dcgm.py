"""DCGM artifacts read by ``pitstop analyze``: ``dcgmi dmon`` text and ``dcgm-exporter`` scrapes, detected from
content, with N/A fields said, scrapes over time cut apart, and hostile files refused in one line.

The inputs are written here from the documented layouts (dmon's ``#Entity`` header of field short names, its
ID/units line and ``GPU n`` rows; the exporter's Prometheus text with ``# HELP`` / ``# TYPE``), not copied.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pitstop.artifacts import IngestError
from pitstop.cli.errors import UserError
from pitstop.core.profile import RunProfile
from pitstop.ingest.dcgm import DCGM_LIMIT, MAX_LINE, dcgm_kind, read_dcgm
from pitstop.ingest.detect import sniff
from pitstop.ingest.load import Inputs, load_run

DMON = """\
#Entity   GRACT  SMACT  SMOCC  TENSO  DRAMA  POWER
ID                                           W
GPU 0     0.981  0.412  0.180  0.003  0.610  402.5
GPU 1     0.975  0.405  0.175  N/A    0.598  398.1
GPU 0     0.984  0.420  0.185  0.004  0.620  405.0
GPU 1     0.979  0.401  0.170  N/A    0.601  399.9
#Entity   GRACT  SMACT  SMOCC  TENSO  DRAMA  POWER
ID                                           W
GPU 0     0.980  0.415  0.181  0.002  0.615  404.2
GPU 1     0.977  0.409  0.172  N/A    0.599  397.0
"""


def _scrape(sm: float, tensor: float, energy_mj: int, stamp: str = "", util: int = 99) -> str:
    labels = 'gpu="{g}",UUID="GPU-{g}aaa",device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"'
    lines = []
    for name, kind, value in (
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", util),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge", 650.5),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", energy_mj),
        ("DCGM_FI_PROF_SM_ACTIVE", "gauge", sm),
        ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", sm / 2),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", tensor),
        ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", 0.3),
    ):
        lines.append(f"# HELP {name} some help text.")
        lines.append(f"# TYPE {name} {kind}")
        for g in (0, 1):
            lines.append(f"{name}{{{labels.format(g=g)}}} {value}{stamp}")
    return "\n".join(lines) + "\n"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_dmon_detected_and_read_per_gpu_with_na_said(tmp_path: Path) -> None:
    path = _write(tmp_path, "anything.txt", DMON)
    assert sniff(path)[0] == "dcgmi_dmon"
    log = read_dcgm(path, "dcgmi_dmon")
    assert [g.activity.gpu for g in log.gpus] == ["0", "1"]
    gpu0, gpu1 = (g.activity for g in log.gpus)
    assert len(gpu0.samples) == 3 and [s.t for s in gpu0.samples] == [0.0, 1.0, 2.0]
    assert gpu0.samples[0].sm_active == pytest.approx(0.412)
    assert gpu0.samples[0].sm_occupancy == pytest.approx(0.180)
    assert gpu0.samples[0].dram_active == pytest.approx(0.610)
    assert gpu0.samples[0].power_w == pytest.approx(402.5)
    assert gpu0.unsupported == [] and gpu1.unsupported == ["tensor_active"]
    assert all(s.tensor_active is None for s in gpu1.samples)
    assert any("tensor_active N/A" in n for n in log.notes)
    assert any("no time in the file" in n for n in log.notes)


def test_dmon_rank_profile_gets_activity_and_samples(tmp_path: Path) -> None:
    profile = load_run(Inputs(paths=[_write(tmp_path, "dmon.log", DMON)]))
    assert len(profile.ranks) == 2
    act = profile.ranks[0].gpu_activity
    assert act is not None and act.source == "dcgmi dmon" and len(act.samples) == 3
    assert [s.power_w for s in profile.ranks[0].gpu_samples][:1] == [402.5]  # power beside utilization
    assert profile.environment.on_gpu
    again = RunProfile.from_dict(profile.to_dict())  # the new field survives the document
    assert again.ranks[1].gpu_activity is not None
    assert again.ranks[1].gpu_activity.unsupported == ["tensor_active"]


def test_old_profile_documents_still_read() -> None:
    doc = {"schema": "x", "source": "doctor", "ranks": [{"rank": 0, "steps": []}]}
    profile = RunProfile.from_dict(doc)
    assert profile.ranks[0].gpu_activity is None


def test_dmon_error_instead_of_samples_is_one_line(tmp_path: Path) -> None:
    text = "#Entity   SMACT  SMOCC\nID\nError setting watches. Result: The requested operation is not supported\n"
    with pytest.raises(IngestError) as err:
        load_run(Inputs(paths=[_write(tmp_path, "dmon.txt", text)]))
    assert "not supported" in str(err.value) and "\n" not in str(err.value)


def test_exporter_single_scrape(tmp_path: Path) -> None:
    path = _write(tmp_path, "metrics", _scrape(0.45, 0.2, 1_000_000))
    assert sniff(path)[0] == "dcgm_exporter"
    log = read_dcgm(path, "dcgm_exporter")
    assert [g.activity.gpu for g in log.gpus] == ["0", "1"]
    assert log.gpus[0].name == "NVIDIA H100 80GB HBM3"
    sample = log.gpus[0].activity.samples[0]
    assert sample.sm_active == pytest.approx(0.45) and sample.tensor_active == pytest.approx(0.2)
    assert sample.energy_j == pytest.approx(1000.0)  # millijoules to joules
    assert sample.util == 99 and sample.power_w == pytest.approx(650.5)


def test_exporter_scrapes_over_time_cut_where_a_series_repeats(tmp_path: Path) -> None:
    text = "".join(_scrape(0.4 + i / 100, 0.1, 1_000_000 + i * 650_000) for i in range(5))
    log = read_dcgm(_write(tmp_path, "loop.txt", text), "dcgm_exporter")
    samples = log.gpus[1].activity.samples
    assert len(samples) == 5 and [s.t for s in samples] == [0, 1, 2, 3, 4]
    assert samples[4].sm_active == pytest.approx(0.44)
    assert samples[4].energy_j - samples[0].energy_j == pytest.approx(2600.0)
    assert not log.gpus[1].activity.timed


def test_exporter_scrapes_with_date_lines_and_with_own_timestamps(tmp_path: Path) -> None:
    dated = "".join(f"{1_700_000_000 + 2 * i}\n" + _scrape(0.5, 0.1, i) for i in range(4))
    act = read_dcgm(_write(tmp_path, "dated.txt", dated), "dcgm_exporter").gpus[0].activity
    assert act.timed and [s.t for s in act.samples] == [0, 2, 4, 6] and act.interval_s == 2
    human = "".join(f"Fri Dec  4 05:3{i}:00 UTC 2026\n" + _scrape(0.5, 0.1, i) for i in range(3))
    act = read_dcgm(_write(tmp_path, "human.txt", human), "dcgm_exporter").gpus[0].activity
    assert act.timed and [s.t for s in act.samples] == [0, 60, 120]
    stamped = "".join(_scrape(0.5, 0.1, i, stamp=f" {1_700_000_000_000 + 500 * i}") for i in range(3))
    act = read_dcgm(_write(tmp_path, "stamped.txt", stamped), "dcgm_exporter").gpus[0].activity
    assert [s.t for s in act.samples] == [0, 0.5, 1.0]


def test_exporter_mig_instances_kept_apart(tmp_path: Path) -> None:
    text = (
        'DCGM_FI_PROF_SM_ACTIVE{gpu="0",GPU_I_ID="1",GPU_I_PROFILE="3g.40gb"} 0.2\n'
        'DCGM_FI_PROF_SM_ACTIVE{gpu="0",GPU_I_ID="2",GPU_I_PROFILE="3g.40gb"} 0.7\n'
    )
    log = read_dcgm(_write(tmp_path, "mig.prom", text), "dcgm_exporter")
    assert [g.activity.gpu for g in log.gpus] == ["0/mig1", "0/mig2"]


def test_exporter_out_of_range_and_na_values(tmp_path: Path) -> None:
    text = 'DCGM_FI_PROF_SM_ACTIVE{gpu="0"} 7.5\nDCGM_FI_PROF_DRAM_ACTIVE{gpu="0"} NaN\nDCGM_FI_DEV_GPU_UTIL{gpu="0"} 80\n'
    log = read_dcgm(_write(tmp_path, "m.txt", text), "dcgm_exporter")
    act = log.gpus[0].activity
    assert act.samples[0].sm_active is None and act.samples[0].util == 80
    assert act.unsupported == ["dram_active", "sm_active"]
    assert any("out of range" in n for n in log.notes)


def test_gzipped_scrape_detected(tmp_path: Path) -> None:
    path = tmp_path / "scrape.gz"
    path.write_bytes(gzip.compress(_scrape(0.3, 0.0, 5).encode()))
    assert sniff(path)[0] == "dcgm_exporter"


def test_not_dcgm() -> None:
    assert dcgm_kind("timestamp, index, utilization.gpu [%]\n") is None
    assert dcgm_kind("# HELP go_goroutines Number of goroutines.\ngo_goroutines 8\n") is None
    assert dcgm_kind("# Entity extraction settings\nmodel: x\n") is None  # a YAML comment
    assert dcgm_kind("# Entity  SMACT  TENSO\nID\nGPU 0  0.1  0.0\n") == "dcgmi_dmon"


def test_dmon_header_with_its_id_column_on_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "d.txt", "# Entity  ID  SMACT  TENSO\r\n    GPU 3  0.250  0.010\r\n")
    act = read_dcgm(path, "dcgmi_dmon").gpus[0].activity
    assert act.gpu == "3" and act.samples[0].sm_active == pytest.approx(0.25)


def test_overlong_line_skipped_not_held(tmp_path: Path) -> None:
    text = _scrape(0.3, 0.1, 5) + "x" * (MAX_LINE * 3) + "\n" + _scrape(0.4, 0.1, 6)
    log = read_dcgm(_write(tmp_path, "long.txt", text), "dcgm_exporter")
    assert len(log.gpus[0].activity.samples) == 2
    assert any("1 lines skipped" in n for n in log.notes)


def test_too_big_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pitstop.ingest.dcgm as dcgm

    monkeypatch.setattr(dcgm, "DCGM_LIMIT", 4096)
    text = "".join(_scrape(0.3, 0.1, i) for i in range(20))
    with pytest.raises(IngestError) as err:
        read_dcgm(_write(tmp_path, "big.txt", text), "dcgm_exporter")
    assert "MiB of DCGM output" in str(err.value) and "\n" not in str(err.value)
    assert DCGM_LIMIT > 4096


def test_many_gpu_labels_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pitstop.ingest.dcgm as dcgm

    monkeypatch.setattr(dcgm, "MAX_GPUS", 8)
    text = "".join(f'DCGM_FI_PROF_SM_ACTIVE{{gpu="{i}"}} 0.5\n' for i in range(1000))
    log = read_dcgm(_write(tmp_path, "many.txt", text), "dcgm_exporter")
    assert len(log.gpus) == 8 and any("more than 8 GPUs" in n for n in log.notes)


def test_analyze_cli_reads_dcgm_and_bad_one_exits_2(tmp_path: Path) -> None:
    from pitstop.cli.app import app

    runner = CliRunner()
    good = _write(tmp_path, "dmon.txt", DMON)
    result = runner.invoke(app, ["analyze", str(good), "--no-history", "--json", str(tmp_path / "out.json")])
    assert result.exit_code == 0, result.output
    bad = _write(tmp_path, "bad.txt", "#Entity SMACT\nID\n")
    result = runner.invoke(app, ["analyze", str(bad), "--no-history"])
    assert isinstance(result.exception, UserError) and result.exception.code == 2  # main() exits with it
    assert "dcgmi dmon output without samples" in str(result.exception)
    assert "\n" not in str(result.exception)


def test_too_many_samples_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pitstop.ingest.dcgm as dcgm

    monkeypatch.setattr(dcgm, "MAX_SAMPLES", 5)
    with pytest.raises(IngestError) as err:
        read_dcgm(_write(tmp_path, "d.txt", DMON), "dcgmi_dmon")  # 6 samples
    assert "more than 5 DCGM samples" in str(err.value) and "\n" not in str(err.value)
