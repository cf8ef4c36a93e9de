"""DCGM recordings as recorders write them: CSV of ``dcgmi dmon`` fields (``EntityId,GRACT,FBUSD,TimeStamp``,
field ids as column names), the GR engine's activity read as utilization, the framebuffer as memory headroom,
and a recording of several runs cut into them. Ground truth: the MIGProfiler A100-40GB sweep, whose own
tables give each run's measured images/s (batch 8 → 253.6 img/s at GRACT 0.676, batch 128 → 469.9 at 0.803)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from tests.conftest import require_shared

from pitstop.artifacts import IngestError
from pitstop.core.vocabulary import CauseId
from pitstop.diagnose import Diagnosis, diagnose
from pitstop.ingest.dcgm import dcgm_kind, read_dcgm
from pitstop.ingest.detect import sniff
from pitstop.ingest.load import Inputs, load_run

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu_logs"
SWEEP = "gpu_runs/dcgm/migprofiler__a100-40g__finetune_vit__dcgm.csv"


def _diagnose(*paths: Path) -> Diagnosis:
    return diagnose(load_run(Inputs(paths=list(paths))))


def _causes(d: Diagnosis) -> set[CauseId]:
    return {f.cause for f in d.findings}


def test_gract_at_0445_with_29_of_40_gb_is_a_batch_too_small() -> None:
    path = FIXTURES / "dcgm_gract_0445_2.9of40gb.csv"
    assert sniff(path)[0] == "dcgm_csv"
    d = _diagnose(path)
    found = [f for f in d.findings if f.cause == CauseId.SMALL_BATCH]
    assert found, [f.cause for f in d.findings]
    ev = found[0].evidence
    assert ev["gpu_util_active"] == pytest.approx(0.445, abs=0.01)  # the GR engine's share, while computing
    assert ev["gpu_mem_used_frac"] == pytest.approx(2970 / 40536, abs=0.005)  # FBUSD over FBUSD + FBFRE
    assert "93% of its memory free" in found[0].summary
    assert found[0].est_speedup is not None and found[0].est_speedup > 2


def test_gract_at_093_finds_nothing_about_the_batch() -> None:
    d = _diagnose(FIXTURES / "dcgm_gract_093.csv")
    assert CauseId.SMALL_BATCH not in _causes(d) and CauseId.IDLE_GPU not in _causes(d)
    assert d.metrics.gpu_util is not None and d.metrics.gpu_util > 0.85  # read: checked, not skipped


def test_field_ids_as_column_names_and_microsecond_clock() -> None:
    path = FIXTURES / "dcgm_field_ids.csv"
    assert dcgm_kind(path.read_text()[:4096]) == "dcgm_csv"
    log = read_dcgm(path, "dcgm_csv")
    act = log.gpus[0].activity
    assert act.timed and act.interval_s == 1.0 and len(act.samples) == 60
    assert act.samples[0].gr_active == pytest.approx(0.40) and act.samples[0].util == 41
    assert act.samples[0].power_w == 180
    assert log.gpus[0].extras[0] == {"fb_used": 3000.0, "fb_total": 40536.0}
    profile = load_run(Inputs(paths=[path]))
    sample = profile.ranks[0].gpu_samples[0]
    assert sample.util == 41  # field 203, utilization itself, wins over the GR engine where both are recorded
    assert sample.mem_used == 3000 * 2**20 and sample.mem_total == 40536 * 2**20


def test_headers_that_are_not_dcgm() -> None:
    assert dcgm_kind("timestamp,gpu_id,utilization_gpu_pct\n") is None
    assert dcgm_kind("a,b,c\n1,2,3\n") is None
    assert dcgm_kind("1001,1002\n0.5,0.2\n") == "dcgm_csv"  # ids only, two of them
    assert dcgm_kind("1001\n0.5\n") is None  # one bare number is a row, not a header
    assert dcgm_kind("EntityId,GRACT,FBUSD,TimeStamp\n") == "dcgm_csv"
    assert dcgm_kind("gpu,DCGM_FI_PROF_GR_ENGINE_ACTIVE,DCGM_FI_DEV_FB_USED\n") == "dcgm_csv"


def test_dmon_text_with_framebuffer_fields(tmp_path: Path) -> None:
    text = "#Entity   GRACT  FBUSD  FBTTL\nID\n" + "".join(
        f"GPU 0     {0.30 + 0.001 * i:.3f}  3000   40960\n" for i in range(20)
    )
    path = tmp_path / "dmon.txt"
    path.write_text(text)
    profile = load_run(Inputs(paths=[path]))
    s = profile.ranks[0].gpu_samples[0]
    assert s.util == pytest.approx(30.0) and s.mem_used == 3000 * 2**20 and s.mem_total == 40960 * 2**20


def test_two_runs_back_to_back_cut_and_the_least_busy_read() -> None:
    path = FIXTURES / "dcgm_two_runs.csv"
    log = read_dcgm(path, "dcgm_csv")
    assert len(log.runs) == 2 and log.chosen == 1
    assert log.runs[0].engine == pytest.approx(0.705, abs=0.01) and log.runs[1].engine > 0.9
    assert all(s.t <= log.runs[0].end for s in log.gpus[0].activity.samples)
    note = next(n for n in log.notes if "2 runs found" in n)
    assert "the rules read run 1" in note and "engine 94%" in note


def test_a_csv_row_that_does_not_fit_is_skipped_and_said(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text(
        "EntityId,GRACT,FBUSD,TimeStamp\n0,0.5,100,1700000000\n0,0.5,1700000001\n0,0.6,100,1700000002\n"
    )
    log = read_dcgm(path, "dcgm_csv")
    assert len(log.gpus[0].activity.samples) == 2 and any("1 lines skipped" in n for n in log.notes)
    only_header = tmp_path / "h.csv"
    only_header.write_text("EntityId,GRACT,FBUSD,TimeStamp\n")
    with pytest.raises(IngestError, match="without sample rows"):
        read_dcgm(only_header, "dcgm_csv")


def test_real_sweep_13_runs_and_the_batch_8_run_underuses_the_a100() -> None:
    """Batch 8 on the whole A100 (run 9) ran at 253.6 img/s against batch 128's 469.9: it is the one the rules
    read, and it is a batch too small; the MIG-slice runs at GRACT ≥ 0.83 are not."""
    path = require_shared(SWEEP)
    log = read_dcgm(path, "dcgm_csv")
    assert len(log.runs) == 13 and log.chosen == 9
    truth = {}
    with (path.parent / "migprofiler__finetune_vit__vit_40g_finetune_bsz.csv").open() as fh:
        for row in csv.DictReader(fh):
            truth[int(row["batch_size"])] = float(row["throughput"]), int(row["start_timestamp"])
    run9 = log.runs[8]
    assert run9.engine == pytest.approx(0.651, abs=0.01)
    assert run9.fb_peak_mib == 4328
    assert log.runs[12].fb_peak_mib == 22706 and log.runs[12].engine > 0.75  # batch 128
    assert truth[128][0] / truth[8][0] == pytest.approx(1.85, abs=0.01)
    d = _diagnose(path)
    small = next(f for f in d.findings if f.cause == CauseId.SMALL_BATCH)
    assert small.evidence["gpu_util_active"] == pytest.approx(0.651, abs=0.01)
    assert 1.3 < (small.est_speedup or 0) <= 1 / 0.6  # bounded by the run's own busy share
    assert any("13 runs found" in n and "the rules read run 9" in n for n in d.profile.notes)


def test_real_sweep_tables_beside_it_are_refused_saying_what_they_are() -> None:
    path = require_shared("gpu_runs/dcgm/migprofiler__finetune_vit__vit_40g_finetune_bsz.csv")
    with pytest.raises(IngestError) as err:
        load_run(Inputs(paths=[path]))
    msg = str(err.value)
    assert "a CSV with columns" in msg and "batch_size" in msg and "no utilization column" in msg
    assert "\n" not in msg
