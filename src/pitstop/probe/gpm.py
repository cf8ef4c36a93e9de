"""NVML's GPU Performance Monitoring (GPM) metrics: SM activity, occupancy, tensor and DRAM activity.

GPM (Hopper and newer, nvidia-ml-py's ``nvmlGpm*``) takes opaque samples of the GPU's counters and turns two
of them into metrics over the time between: ``nvmlGpmMetricsGet`` with ``sample1`` and ``sample2``. Support is
queried (``nvmlGpmQueryDeviceSupport``), never assumed from the GPU's name; each metric carries its own return
code, so one the GPU cannot count is said as unsupported while the others are kept. On a MIG slice the samples
are the slice's GPU instance's (``nvmlGpmMigSampleGet`` on the parent device).
"""

from __future__ import annotations

import contextlib
from typing import Any

NVML_SUCCESS = 0
MIB = 2**20
# metric id -> (ActivitySample field, scale to pitstop's unit). Ids from nvml.h's nvmlGpmMetricId_t; the
# *_UTIL metrics are percentages, PCIe traffic MiB/s.
METRICS: dict[int, tuple[str, float]] = {
    1: ("gr_active", 0.01),  # NVML_GPM_METRIC_GRAPHICS_UTIL
    2: ("sm_active", 0.01),  # NVML_GPM_METRIC_SM_UTIL
    3: ("sm_occupancy", 0.01),  # NVML_GPM_METRIC_SM_OCCUPANCY
    5: ("tensor_active", 0.01),  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    10: ("dram_active", 0.01),  # NVML_GPM_METRIC_DRAM_BW_UTIL
    20: ("pcie_tx", float(MIB)),  # NVML_GPM_METRIC_PCIE_TX_PER_SEC
    21: ("pcie_rx", float(MIB)),  # NVML_GPM_METRIC_PCIE_RX_PER_SEC
}
RATIO_FIELDS = ("gr_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active")


class GpmReader:
    """Two GPM samples of one GPU (or GPU instance), alternated: each ``read`` takes a new one and returns
    the metrics since the previous (None for the first)."""

    def __init__(self, nvml: Any, handle: Any, instance: int | None, samples: tuple[Any, Any]) -> None:
        self.nvml, self.handle, self.instance = nvml, handle, instance
        self.previous, self.current = samples
        self.primed = False
        self.closed = False
        self.unsupported: set[str] = set()

    @classmethod
    def open(cls, nvml: Any, handle: Any) -> tuple[GpmReader | None, str | None]:
        """(reader, None) where the GPU supports GPM, else (None, why not) in a few words."""
        if not hasattr(nvml, "nvmlGpmQueryDeviceSupport"):
            return None, "no GPM in this pynvml (nvidia-ml-py 12 or newer has it)"
        device, instance = handle, None
        with contextlib.suppress(Exception):
            if nvml.nvmlDeviceIsMigDeviceHandle(handle):
                device = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
                instance = int(nvml.nvmlDeviceGetGpuInstanceId(handle))
        try:
            support = nvml.nvmlGpmQueryDeviceSupport(device)
        except Exception as exc:
            return None, f"GPM not available ({exc})"
        if not getattr(support, "isSupportedDevice", 0):
            return None, "GPM not supported on this GPU (Hopper and newer have it)"
        try:
            samples = (nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc())
        except Exception as exc:
            return None, f"GPM samples could not be allocated ({exc})"
        return cls(nvml, device, instance, samples), None

    def _take(self, sample: Any) -> None:
        if self.instance is None:
            self.nvml.nvmlGpmSampleGet(self.handle, sample)
        else:
            self.nvml.nvmlGpmMigSampleGet(self.handle, self.instance, sample)

    def read(self) -> dict[str, float | None] | None:
        """The metrics between the previous sample and a new one, in pitstop's units; None the first time.
        A metric whose own return code is an error is None and named in ``unsupported``."""
        self._take(self.current)
        if not self.primed:
            self.primed = True
            self.previous, self.current = self.current, self.previous
            return None
        request = self.nvml.c_nvmlGpmMetricsGet_t()
        request.version = self.nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(METRICS)
        request.sample1, request.sample2 = self.previous, self.current
        for i, metric in enumerate(METRICS):
            request.metrics[i].metricId = metric
        self.nvml.nvmlGpmMetricsGet(request)
        out: dict[str, float | None] = {}
        for i, (name, scale) in enumerate(METRICS.values()):
            got = request.metrics[i]
            value = float(got.value) * scale
            if got.nvmlReturn != NVML_SUCCESS or value != value or value < 0:
                self.unsupported.add(name)
                out[name] = None
                continue
            out[name] = min(value, 1.0) if name in RATIO_FIELDS else value
        self.previous, self.current = self.current, self.previous
        return out

    def close(self) -> None:
        """Free the two samples, once (a second free would hand NVML a dangling handle)."""
        if self.closed:
            return
        self.closed = True
        for sample in (self.previous, self.current):
            with contextlib.suppress(Exception):
                self.nvml.nvmlGpmSampleFree(sample)
