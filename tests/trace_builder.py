"""Small hand-made Kineto traces for the edges of the trace rules: events written the way Kineto writes them
(``cpu_op`` / ``user_annotation`` / ``cuda_runtime`` / ``kernel`` complete events with correlation ids), with
exactly the markers a test wants and no others."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.kineto_ranks import kernel_event, runtime_event


@dataclass
class TraceBuilder:
    gpu: str = "NVIDIA H100 80GB HBM3"
    events: list[dict[str, Any]] = field(default_factory=list)
    _corr: int = 1000

    def cpu(self, name: str, ts: float, dur: float, cat: str = "cpu_op") -> None:
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}}
        )

    def runtime(self, name: str, ts: float, dur: float) -> int:
        self._corr += 1
        event = runtime_event(name, ts, dur, self._corr)
        event["args"]["External id"] = self._corr
        self.events.append(event)
        return self._corr

    def kernel(
        self, name: str, ts: float, dur: float, launch_ts: float, launch: str = "cudaLaunchKernel"
    ) -> None:
        """A kernel and the runtime call that launched it (10 µs, at ``launch_ts``)."""
        corr = self.runtime(launch, launch_ts, 10.0)
        self.events.append(kernel_event(name, ts, dur, corr, 7, {"External id": corr}))

    def write(self, path: Path) -> Path:
        doc = {
            "schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": self.gpu, "totalGlobalMem": 85899345920}],
            "traceEvents": self.events,
        }
        path.write_text(json.dumps(doc, indent=0))
        return path


def hipfree_trace() -> TraceBuilder:
    """An MI300X loop with the caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) and no ProfilerStep:
    every 10 ms the host launches 1.06 ms of kernels and then sits 9.86 ms in hipFree (98.6% of its time)
    while the GPU is busy 10.6% of it. Forward only, no backward: an inference loop. The file
    tests/fixtures/traces/hipfree_no_steps.json is this builder's output."""
    t = TraceBuilder(gpu="AMD Instinct MI300X")
    for i in range(10):
        t0 = i * 10_000.0
        t.cpu("aten::linear", t0, 130.0)
        t.runtime("hipMalloc", t0 + 5, 20.0)
        t.kernel(
            "Cijk_Ailk_Bljk_SB_MT64x64x16_MI32x32x2x1", t0 + 45, 700.0, t0 + 30, launch="hipLaunchKernel"
        )
        t.kernel(
            "void at::native::elementwise_kernel<128, 2>", t0 + 750, 360.0, t0 + 60, launch="hipLaunchKernel"
        )
        t.runtime("hipFree", t0 + 140, 9_860.0)
    return t


if __name__ == "__main__":  # regenerate the fixture
    hipfree_trace().write(Path(__file__).parent / "fixtures" / "traces" / "hipfree_no_steps.json")
