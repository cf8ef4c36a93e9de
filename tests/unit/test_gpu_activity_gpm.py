"""GPM sampling in the NVML sampler, against a stand-in for pynvml's GPM API that has the real structures'
shape (``c_nvmlGpmMetricsGet_t`` with ``version``, ``numMetrics``, ``sample1``/``sample2`` and ``metrics[i]``
carrying ``metricId``, ``nvmlReturn`` and ``value``): support queried, metrics per pair of samples, a metric
the GPU cannot count said as unsupported, MIG slices through the MIG sample call, and nothing read where
GPM is absent."""

from __future__ import annotations

import time
from typing import Any

import pytest

from pitstop.probe.collectors.samplers import GpmReader, NvmlSampler, RecordedNvml

NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED


class _Metric:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = 0
        self.value = 0.0


class _MetricsGet:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [_Metric() for _ in range(98)]


class _Support:
    def __init__(self, supported: int) -> None:
        self.version = 1
        self.isSupportedDevice = supported


class StandInGpm(RecordedNvml):
    """Recorded NVML readings plus GPM: each GPM sample takes the next recorded counter values (percent), and
    a metric id in ``missing`` comes back with NVML_ERROR_NOT_SUPPORTED."""

    NVML_GPM_METRICS_GET_VERSION = 1
    c_nvmlGpmMetricsGet_t = _MetricsGet

    def __init__(
        self,
        gpm: list[dict[int, float]],
        supported: int = 1,
        missing: tuple[int, ...] = (),
        mig: bool = False,
    ) -> None:
        super().__init__([{"util": 99, "mem_used": 1, "mem_total": 2, "power_mw": 650_000}])
        self.gpm, self.supported, self.missing, self.mig = gpm, supported, missing, mig
        self.taken = 0
        self.calls: list[str] = []
        self.freed = 0
        self.energy_mj = 10_000_000

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> _Support:
        self.calls.append(f"support:{handle}")
        return _Support(self.supported)

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> int:
        return int(self.mig)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any) -> str:
        return "parent"

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return 2

    def nvmlGpmSampleAlloc(self) -> dict[str, Any]:
        return {}

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.freed += 1

    def nvmlGpmSampleGet(self, handle: Any, sample: dict[str, Any]) -> None:
        self.calls.append(f"sample:{handle}")
        sample["values"] = self.gpm[min(self.taken, len(self.gpm) - 1)]
        self.taken += 1

    def nvmlGpmMigSampleGet(self, handle: Any, instance: int, sample: dict[str, Any]) -> None:
        self.calls.append(f"mig:{handle}:{instance}")
        sample["values"] = self.gpm[min(self.taken, len(self.gpm) - 1)]
        self.taken += 1

    def nvmlGpmMetricsGet(self, request: _MetricsGet) -> _MetricsGet:
        assert request.version == 1 and request.sample1 is not request.sample2
        for metric in request.metrics[: request.numMetrics]:
            if metric.metricId in self.missing:
                metric.nvmlReturn = NOT_SUPPORTED
                continue
            metric.value = request.sample2["values"].get(metric.metricId, 0.0)  # the later window's reading
        return request

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        self.energy_mj += 65_000  # 650 W for 0.1 s
        return self.energy_mj


def _reading(sm: float, occ: float, tensor: float, dram: float) -> dict[int, float]:
    return {1: 99.0, 2: sm, 3: occ, 5: tensor, 10: dram, 20: 100.0, 21: 50.0}


def _sampler(nvml: Any, ticks: int, every: int = 2) -> NvmlSampler:
    sampler = NvmlSampler(
        nvml, "gpu0", origin=time.perf_counter(), interval_s=0.0, activity=True, activity_every=every
    )
    for _ in range(ticks):
        sampler.sample_once()
    sampler.close()
    return sampler


def test_gpm_metrics_between_samples_in_fractions_and_bytes() -> None:
    nvml = StandInGpm([_reading(40, 15, 1, 60), _reading(42, 16, 2, 62), _reading(38, 14, 0.5, 58)])
    sampler = _sampler(nvml, ticks=6, every=2)  # activity at ticks 0, 2, 4
    assert len(sampler.samples) == 6 and nvml.taken == 3
    act = sampler.activity()
    assert act is not None and act.source == "nvml gpm" and act.timed and act.unsupported == []
    first, second, third = act.samples
    assert first.sm_active is None and first.energy_j == pytest.approx(10_065)  # GPM's first sample primes
    assert second.sm_active == pytest.approx(0.42) and second.sm_occupancy == pytest.approx(0.16)
    assert second.tensor_active == pytest.approx(0.02) and second.dram_active == pytest.approx(0.62)
    assert second.gr_active == pytest.approx(0.99) and second.pcie_tx == pytest.approx(100 * 2**20)
    assert third.sm_active == pytest.approx(0.38)
    assert third.energy_j - first.energy_j == pytest.approx(
        2 * 65
    )  # the counter read at each activity sample
    assert nvml.freed == 2  # both GPM samples freed, once


def test_a_metric_the_gpu_cannot_count_is_said() -> None:
    nvml = StandInGpm([_reading(40, 15, 1, 60)] * 3, missing=(5,))
    act = _sampler(nvml, ticks=3, every=1).activity()
    assert act is not None and act.unsupported == ["tensor_active"]
    assert all(s.tensor_active is None for s in act.samples) and act.samples[1].sm_active == pytest.approx(
        0.4
    )


def test_gpm_not_supported_keeps_the_energy_counter_and_says_why() -> None:
    nvml = StandInGpm([_reading(40, 15, 1, 60)], supported=0)
    sampler = _sampler(nvml, ticks=3, every=1)
    assert nvml.taken == 0 and sampler.gpm is None
    assert sampler.activity_notes == ["GPM not supported on this GPU (Hopper and newer have it)"]
    act = sampler.activity()
    assert act is not None and act.source == "nvml" and all(s.sm_active is None for s in act.samples)
    assert [s.energy_j for s in act.samples] == pytest.approx([10_065, 10_130, 10_195])


def test_no_gpm_api_and_no_energy_is_no_activity() -> None:
    plain = RecordedNvml([{"util": 50}])
    sampler = _sampler(plain, ticks=3, every=1)
    assert sampler.activity() is None and "no GPM in this pynvml" in sampler.activity_notes[0]
    quiet = NvmlSampler(StandInGpm([_reading(1, 1, 1, 1)]), "gpu0", origin=0.0, interval_s=0.0)
    quiet.sample_once()
    assert quiet.activity() is None and quiet.gpm is None  # activity off by default: nothing queried


def test_a_mig_slice_is_sampled_through_its_gpu_instance() -> None:
    nvml = StandInGpm([_reading(30, 10, 0, 20)] * 2, mig=True)
    reader, why = GpmReader.open(nvml, "slice")
    assert reader is not None and why is None
    assert reader.read() is None
    assert reader.read() is not None
    assert nvml.calls == ["support:parent", "mig:parent:2", "mig:parent:2"]


def test_a_gpm_failure_stops_gpm_not_the_sampler() -> None:
    nvml = StandInGpm([_reading(30, 10, 0, 20)])

    def broken(request: Any) -> None:
        raise RuntimeError("NVML_ERROR_UNKNOWN")

    nvml.nvmlGpmMetricsGet = broken  # type: ignore[method-assign, assignment]
    sampler = _sampler(nvml, ticks=4, every=1)
    assert len(sampler.samples) == 4 and sampler.gpm is None
    assert any("GPM sampling stopped" in n for n in sampler.activity_notes)
