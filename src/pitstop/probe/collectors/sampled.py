"""The samplers: the GPU through NVML (utilization, memory, clocks and their throttle reasons, power, and the
activity counters where the GPU has them) and the host (CPU, memory), on threads of their own from the
first optimizer step (``probe.samplers``). Their readings stream to the rank file as they come."""

from __future__ import annotations

from typing import Any

from pitstop.probe.collectors.base import Collector, Emit, ProbeContext, collector
from pitstop.probe.samplers import HostSampler, NvmlSampler, RecordedNvml, open_nvml
from pitstop.profile import RankProfile, to_jsonable
from pitstop.vocabulary import Device


@collector
class SamplersCollector(Collector):
    """The counters are the samplers' sample lists; how many of each went to the rank file so far."""

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.nvml: NvmlSampler | None = None
        self.host: HostSampler | None = None
        self._streamed = {"gpu": 0, "host": 0}
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
        for kind, sampler in (("gpu", self.nvml), ("host", self.host)):
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
