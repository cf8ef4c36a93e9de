"""The samplers: the GPU through NVML (10 Hz: utilization, memory, PCIe, clocks and their throttle reasons,
power, and the activity counters where the GPU has them) and the trainer's CPU use through psutil (2 Hz), on
threads of their own from the first optimizer step; their readings stream to the rank file as they come.

``NvmlSampler`` is attach's too: ``attach/gpus.py`` samples the GPUs of a job it attached to from pitstop's
own process with this same class. That is why everything here but the collector at the end stands without a
probe, and why the module imports neither torch nor pynvml at its top.

Each sampler is a daemon thread that reads a *source* and appends samples; the source for NVML is any object
with pynvml's functions, so recorded readings (``RecordedNvml``) go through exactly the code a live GPU does.
Samples are taken on a fixed schedule (start + k · interval), not "interval after the last one": NVML's two
PCIe throughput queries each block ~20 ms, which would otherwise stretch a 10 Hz sampler to ~7 Hz. A deadline
missed because a sample took longer is skipped, not made up in a burst. A sampler that fails stops itself
quietly; it never raises into the training process.

Clock-event (throttle) reasons: pynvml renamed ``nvmlDeviceGetCurrentClocksThrottleReasons`` to
``...ClocksEventReasons`` (driver 535); either is used. The application clock is the SM clock the GPU is set
to run at; a busy GPU below it with a power or thermal reason set is throttled.

GPU Performance Monitoring (GPM: SM activity, occupancy, tensor and DRAM activity; Hopper and newer,
nvidia-ml-py's ``nvmlGpm*``) takes opaque samples of the GPU's counters and turns two of them into metrics
over the time between: ``nvmlGpmMetricsGet`` with ``sample1`` and ``sample2``. Support is queried
(``nvmlGpmQueryDeviceSupport``), never assumed from the GPU's name; each metric carries its own return code,
so one the GPU cannot count is said as unsupported while the others are kept. On a MIG slice the samples are
the slice's GPU instance's (``nvmlGpmMigSampleGet`` on the parent device).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pitstop.core.profile import (
    ActivitySample,
    GpuActivity,
    GpuSample,
    HostSample,
    RankProfile,
    to_jsonable,
)
from pitstop.core.vocabulary import Device
from pitstop.probe.collectors.base import Collector, Emit, ProbeContext, collector
from pitstop.probe.rankfile import Kind

NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_CLOCK_SM = 1
ACTIVITY_EVERY = (
    10  # activity read every 10th sample: 1 Hz at the sampler's 10 Hz (GPM averages between reads)
)


# -- clock-event (throttle) reasons, read beside each NVML sample --------------------------------------------


def clock_events(read: Callable[..., Any], sm_clock_id: int) -> tuple[int | None, float | None]:
    """(reasons bitmask, application SM clock in MHz) through ``read(function_name, *args)``, which answers
    None for a function the library or the GPU lacks."""
    reasons = read("nvmlDeviceGetCurrentClocksEventReasons")
    if reasons is None:
        reasons = read("nvmlDeviceGetCurrentClocksThrottleReasons")
    app = read("nvmlDeviceGetApplicationsClock", sm_clock_id)
    return (None if reasons is None else int(reasons)), (None if app is None else float(app))


# -- GPM: the activity counters ------------------------------------------------------------------------------

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


# -- the samplers --------------------------------------------------------------------------------------------


class _Sampler:
    def __init__(
        self, interval_s: float, origin: float, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.interval_s = interval_s
        self.origin = origin
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"pitstop-{type(self).__name__}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        self.close()

    def close(self) -> None:
        """Release what the source holds (after the thread has ended)."""

    def _run(self) -> None:
        self.run_until(self._stop.is_set, self._stop.wait)

    def run_until(self, stopped: Callable[[], bool], wait: Callable[[float], object]) -> None:
        """Sample at start + k · interval until ``stopped()``; ``wait`` sleeps (interruptibly)."""
        try:
            start = self.clock()
            k = 0
            while not stopped():
                self.sample_once()
                if self.interval_s > 0:  # the next deadline still ahead; missed ones are skipped
                    k = max(k + 1, int((self.clock() - start) / self.interval_s) + 1)
                wait(max(0.0, start + k * self.interval_s - self.clock()))
        except Exception as exc:  # a sampler failure loses samples, never the run
            self.error = f"{type(self).__name__}: {exc}"

    def sample_once(self) -> None:
        raise NotImplementedError


class NvmlSampler(_Sampler):
    """Reads utilization, memory, PCIe, SM clock and power of one GPU; with ``activity``, also the energy
    counter and (where the GPU has GPM) SM, tensor and DRAM activity, every ``activity_every`` samples."""

    def __init__(
        self,
        nvml: Any,
        handle: Any,
        origin: float,
        interval_s: float = 0.1,
        clock: Callable[[], float] = time.perf_counter,
        owns_nvml: bool = False,
        activity: bool = False,
        activity_every: int = ACTIVITY_EVERY,
    ) -> None:
        super().__init__(interval_s, origin, clock)
        self.nvml = nvml
        self.handle = handle
        self.owns_nvml = owns_nvml  # this sampler called nvmlInit and must call nvmlShutdown
        self.samples: list[GpuSample] = []
        self.activity_samples: list[ActivitySample] = []
        self.activity_notes: list[str] = []
        self.activity_every = max(1, activity_every)
        self._ticks = 0
        self._activity = activity
        self.gpm: GpmReader | None = None
        if activity:
            self.gpm, why = GpmReader.open(nvml, handle)
            if why:
                self.activity_notes.append(why)

    def activity(self, gpu: str = "0") -> GpuActivity | None:
        """What the activity counters read, for the rank's profile; None when nothing was read."""
        if not self.activity_samples:
            return None
        read = {n for s in self.activity_samples for n in vars(s) if n != "t" and getattr(s, n) is not None}
        unsupported = sorted(self.gpm.unsupported - read) if self.gpm is not None else []
        return GpuActivity(
            source="nvml gpm" if self.gpm is not None else "nvml",
            gpu=gpu,
            samples=list(self.activity_samples),
            unsupported=unsupported,
            interval_s=self.interval_s * self.activity_every,
            timed=True,
        )

    def _read_activity(self, t: float) -> None:
        """The energy counter (mJ) and the GPM metrics since the last activity sample; a GPM failure stops GPM
        sampling with a note, never the sampler."""
        energy = self._try("nvmlDeviceGetTotalEnergyConsumption")
        metrics: dict[str, float | None] | None = None
        if self.gpm is not None:
            try:
                metrics = self.gpm.read()
            except Exception as exc:
                self.activity_notes.append(f"GPM sampling stopped: {type(exc).__name__}: {exc}")
                self.gpm.close()
                self.gpm = None
        if energy is None and not metrics:
            return
        self.activity_samples.append(
            ActivitySample(
                t=t, energy_j=None if energy is None else float(energy) / 1000.0, **(metrics or {})
            )
        )

    def close(self) -> None:
        if self.gpm is not None:
            self.gpm.close()
        if self.owns_nvml:
            self.owns_nvml = False
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()

    def _try(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self.nvml, fn)(self.handle, *args)
        except Exception:
            return None

    def sample_once(self) -> None:
        util = self._try("nvmlDeviceGetUtilizationRates")
        mem = self._try("nvmlDeviceGetMemoryInfo")
        rx = self._try("nvmlDeviceGetPcieThroughput", NVML_PCIE_UTIL_RX_BYTES)
        tx = self._try("nvmlDeviceGetPcieThroughput", NVML_PCIE_UTIL_TX_BYTES)
        clock = self._try("nvmlDeviceGetClockInfo", NVML_CLOCK_SM)
        power = self._try("nvmlDeviceGetPowerUsage")
        reasons, app_clock = clock_events(self._try, NVML_CLOCK_SM)
        self.samples.append(
            GpuSample(
                t=self.clock() - self.origin,
                util=None if util is None else float(util.gpu),
                mem_used=None if mem is None else int(mem.used),
                mem_total=None if mem is None else int(mem.total),
                pcie_rx=None if rx is None else float(rx) * 1024.0,  # NVML reports KB/s
                pcie_tx=None if tx is None else float(tx) * 1024.0,
                sm_clock=None if clock is None else float(clock),
                power_w=None if power is None else float(power) / 1000.0,  # mW
                clock_reasons=reasons,
                app_clock=app_clock,
            )
        )
        if self._activity and self._ticks % self.activity_every == 0:
            self._read_activity(self.samples[-1].t)
        self._ticks += 1


class HostSampler(_Sampler):
    """CPU use of the trainer process and of its children (DataLoader workers), in % of one core."""

    def __init__(self, origin: float, interval_s: float = 0.5) -> None:
        super().__init__(interval_s, origin)
        import psutil

        self._psutil = psutil
        self._me = psutil.Process(os.getpid())
        self._me.cpu_percent(None)
        self._children: dict[int, Any] = {}
        self.samples: list[HostSample] = []

    def sample_once(self) -> None:
        main = self._me.cpu_percent(None)
        workers_pct = 0.0
        alive = 0
        for child in self._me.children(recursive=True):
            proc = self._children.get(child.pid)
            if proc is None:
                self._children[child.pid] = child
                child.cpu_percent(None)  # prime; the first reading is meaningless
                continue
            try:
                workers_pct += proc.cpu_percent(None)
                alive += 1
            except self._psutil.Error:
                self._children.pop(child.pid, None)
        self.samples.append(HostSample(time.perf_counter() - self.origin, main, workers_pct, alive))


class RecordedNvml:
    """pynvml's reading functions, answered from a recording (JSON list of readings) in order.

    A reading is ``{"util": %, "mem_used": bytes, "mem_total": bytes, "pcie_rx_kbs": .., "pcie_tx_kbs": ..,
    "sm_clock": MHz, "power_mw": ..}``; missing keys make the matching call fail, as on GPUs that lack
    the counter. After the last reading the recording repeats its last value.
    """

    class _Util:
        def __init__(self, gpu: float) -> None:
            self.gpu = gpu

    class _Mem:
        def __init__(self, used: int, total: int) -> None:
            self.used, self.total = used, total

    def __init__(self, readings: list[dict[str, Any]]) -> None:
        if not readings:
            raise ValueError("a recording needs at least one reading")
        self.readings = readings
        self._i = 0
        self._current = readings[0]

    @classmethod
    def load(cls, path: Path) -> RecordedNvml:
        return cls(json.loads(Path(path).read_text()))

    def _field(self, key: str) -> Any:
        if key not in self._current:
            raise RuntimeError(f"NVML: {key} not supported")
        return self._current[key]

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        # a new reading starts with utilization, the first call of every sample
        self._current = self.readings[min(self._i, len(self.readings) - 1)]
        self._i += 1
        return self._Util(self._field("util"))

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        return self._Mem(self._field("mem_used"), self._field("mem_total"))

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> Any:
        return self._field("pcie_rx_kbs" if counter == NVML_PCIE_UTIL_RX_BYTES else "pcie_tx_kbs")

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> Any:
        return self._field("sm_clock")

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> Any:
        return self._field("power_mw")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> Any:
        return self._field("clock_reasons")

    def nvmlDeviceGetApplicationsClock(self, handle: Any, clock: int) -> Any:
        return self._field("app_clock")


# -- the GPU this process trains on, a MIG slice's own -------------------------------------------------------

NVML_DEVICE_MIG_ENABLE = 1
MIG_UNMEASURED = (
    "GPU utilization cannot be measured on a MIG slice (NVML does not report it per instance); "
    "memory is the slice's own"
)


def _uuid_hex(text: Any) -> str:
    """A UUID's hex digits, without NVML's "GPU-" / "MIG-" prefix, for comparing across APIs."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return re.sub(r"[^0-9a-f]", "", re.sub(r"^(gpu|mig)-", "", str(text).strip().lower()))


def mig_handle(nvml: Any, parent: Any, uuid: str | None) -> Any:
    """The NVML handle of the MIG slice whose UUID is ``uuid`` on ``parent``; None when none matches."""
    if not uuid:
        return None
    wanted = _uuid_hex(uuid)
    for i in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(parent))):
        try:
            handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i)
        except Exception:  # NVML_ERROR_NOT_FOUND for unused slots
            continue
        if _uuid_hex(nvml.nvmlDeviceGetUUID(handle)) == wanted:
            return handle
    return None


def open_nvml(
    cuda_index: int, pci_bus_id: str | None, uuid: str | None = None, gpu_name: str | None = None
) -> tuple[Any, Any, list[str]]:
    """(pynvml module, handle, notes) for the CUDA device this process trains on.

    On a MIG slice the PCI bus id and the index name the parent GPU, whose counters describe the whole
    card; the slice's own handle comes from the parent's MIG devices, matched by the CUDA UUID. NVML does
    not report utilization per MIG instance: the notes say so. The handle is None when no sampling is
    possible (the module is then shut down again).
    """
    import pynvml

    pynvml.nvmlInit()
    try:
        return _open_handle(pynvml, cuda_index, pci_bus_id, uuid, gpu_name)
    except Exception:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
        raise


def _open_handle(
    pynvml: Any, cuda_index: int, pci_bus_id: str | None, uuid: str | None, gpu_name: str | None
) -> tuple[Any, Any, list[str]]:
    handle = None
    if pci_bus_id:
        with contextlib.suppress(Exception):
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id.encode())
    if handle is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        ordinals = [v.strip() for v in visible.split(",") if v.strip()]
        index = (
            int(ordinals[cuda_index])
            if cuda_index < len(ordinals) and ordinals[cuda_index].isdigit()
            else cuda_index
        )
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    mig_on = False
    with contextlib.suppress(Exception):
        mig_on = int(pynvml.nvmlDeviceGetMigMode(handle)[0]) == NVML_DEVICE_MIG_ENABLE
    if not mig_on and not (gpu_name and " MIG " in f" {gpu_name} "):
        return pynvml, handle, []
    slice_handle = None
    with contextlib.suppress(Exception):
        slice_handle = mig_handle(pynvml, handle, uuid)
    if slice_handle is None:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
        return pynvml, None, ["GPU not sampled: cannot tell which MIG slice this process uses"]
    return pynvml, slice_handle, [MIG_UNMEASURED]


# -- the probe's collector -----------------------------------------------------------------------------------


@collector
class SamplersCollector(Collector):
    """The counters are the samplers' sample lists; how many of each went to the rank file so far."""

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.nvml: NvmlSampler | None = None
        self.host: HostSampler | None = None
        self._streamed = {Kind.GPU: 0, Kind.HOST: 0}
        self._stopped = False

    def begin(self) -> None:
        errors = self.ctx.errors
        try:
            self.host = HostSampler(self.ctx.origin)
            self.host.start()
        except Exception as exc:  # psutil missing or refused: host samples are optional
            errors.append(f"host sampler: {exc}")
        nvml, handle, owns = self._open_nvml()
        if nvml is not None:
            self.nvml = NvmlSampler(nvml, handle, self.ctx.origin, owns_nvml=owns, activity=True)
            self.nvml.start()

    def _open_nvml(self) -> tuple[Any, Any, bool]:
        """(the NVML module or a recording, the device's handle, whether the sampler must shut NVML down)."""
        errors = self.ctx.errors
        if self.ctx.config.nvml_replay is not None:
            return RecordedNvml.load(self.ctx.config.nvml_replay), None, False
        env = self.ctx.environment
        if env is None or env.device != Device.CUDA:
            return None, None, False
        try:
            import torch

            device = self.ctx.device
            index = device.index if device.index is not None else torch.cuda.current_device()
            props = torch.cuda.get_device_properties(index)
            nvml, handle, notes = open_nvml(index, _pci_bus_id(props), _uuid(props), env.gpu_name)
            errors.extend(notes)
            return (nvml if handle is not None else None), handle, True
        except ImportError:
            errors.append("GPU utilization not sampled: install pitstop[nvml] (nvidia-ml-py)")
        except Exception as exc:
            errors.append(f"NVML unavailable: {exc}")
        return None, None, False

    def stream(self, emit: Emit) -> None:
        for kind, sampler in ((Kind.GPU, self.nvml), (Kind.HOST, self.host)):
            if sampler is None:
                continue
            new = sampler.samples[self._streamed[kind] :]
            if new:
                emit(kind, samples=to_jsonable(new))
                self._streamed[kind] += len(new)

    def stop_window(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for sampler in (self.nvml, self.host):
            if sampler is not None:
                sampler.stop()
                if sampler.error:
                    self.ctx.errors.append(sampler.error)

    def fill(self, draft: RankProfile) -> None:
        draft.gpu_samples = list(self.nvml.samples) if self.nvml else []
        draft.gpu_activity = self.nvml.activity() if self.nvml else None
        draft.host_samples = list(self.host.samples) if self.host else []


def _pci_bus_id(props: Any) -> str | None:
    """NVML's bus id ("00000000:18:00.0") of a CUDA device, when torch exposes the PCI location."""
    bus, device = getattr(props, "pci_bus_id", None), getattr(props, "pci_device_id", None)
    if bus is None or device is None:
        return None
    return f"{getattr(props, 'pci_domain_id', 0):08x}:{bus:02x}:{device:02x}.0"


def _uuid(props: Any) -> str | None:
    """The CUDA device's UUID as text (a MIG slice has its own), to find its NVML handle."""
    uuid = getattr(props, "uuid", None)
    return None if uuid is None else str(uuid)
