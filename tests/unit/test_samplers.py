"""The NVML sampler on recorded readings (the same code a live GPU goes through), and the host sampler."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest
from tests.factories import profile

from pitstop.diagnose import diagnose
from pitstop.probe.collectors.samplers import HostSampler, NvmlSampler, RecordedNvml


def _readings_from_nvidia_smi(path: Path, limit: int = 200) -> list[dict[str, float]]:
    """Turn a real `nvidia-smi --query-gpu=... --format=csv` log into NVML readings."""
    readings = []
    with path.open() as f:
        for row in csv.DictReader(f, skipinitialspace=True):
            readings.append(
                {
                    "util": float(row["utilization.gpu [%]"].split()[0]),
                    "mem_used": int(float(row["memory.used [MiB]"].split()[0]) * 2**20),
                    "mem_total": 24 * 2**30,
                    "power_mw": float(row["power.draw [W]"].split()[0]) * 1000,
                }
            )
            if len(readings) >= limit:
                break
    return readings


def test_recorded_nvml_goes_through_the_sampler(shared_data: Path) -> None:
    log = next((shared_data / "nvidia_smi").glob("*.csv"))
    readings = _readings_from_nvidia_smi(log)
    sampler = NvmlSampler(RecordedNvml(readings), handle=None, origin=time.perf_counter(), interval_s=0.0)
    for _ in readings:
        sampler.sample_once()
    assert [s.util for s in sampler.samples] == [r["util"] for r in readings]
    assert sampler.samples[0].mem_used == readings[0]["mem_used"]
    assert sampler.samples[0].power_w == pytest.approx(readings[0]["power_mw"] / 1000)
    assert sampler.samples[0].pcie_rx is None  # this log has no PCIe columns: unknown, not zero

    p = profile("cuda")
    p.ranks[0].gpu_samples = sampler.samples
    expected = sum(r["util"] for r in readings) / len(readings) / 100
    assert diagnose(p).metrics.gpu_util == pytest.approx(expected)


def test_recorded_pcie_is_converted_from_kb_per_second() -> None:
    rec = RecordedNvml(
        [
            {
                "util": 50,
                "mem_used": 1,
                "mem_total": 2,
                "pcie_rx_kbs": 1000,
                "pcie_tx_kbs": 10,
                "sm_clock": 1410,
                "power_mw": 250000,
            }
        ]
    )
    sampler = NvmlSampler(rec, None, time.perf_counter(), interval_s=0.0)
    sampler.sample_once()
    s = sampler.samples[0]
    assert (s.pcie_rx, s.pcie_tx, s.sm_clock, s.power_w) == (1024000.0, 10240.0, 1410.0, 250.0)


def test_sampler_thread_runs_and_stops() -> None:
    rec = RecordedNvml([{"util": 10}, {"util": 20}])
    sampler = NvmlSampler(rec, None, time.perf_counter(), interval_s=0.01)
    sampler.start()
    time.sleep(0.1)
    sampler.stop()
    n = len(sampler.samples)
    assert n >= 3 and sampler.samples[-1].util == 20  # the last reading repeats
    time.sleep(0.05)
    assert len(sampler.samples) == n


def test_host_sampler_reads_this_process() -> None:
    pytest.importorskip("psutil")
    sampler = HostSampler(time.perf_counter(), interval_s=0.01)
    sum(i * i for i in range(200_000))
    sampler.sample_once()
    assert sampler.samples and sampler.samples[0].main_cpu_pct >= 0.0
