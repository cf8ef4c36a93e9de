"""Issue 30 item 5 on a real GPU: the activity counters over one window of a small CUDA training.

- the probe's GPM sampling (SM active, tensor, DRAM) over its window, with what the GPU could not count;
- the energy counter's power against the sampled power draw of the same window;
- GPM's SM activity against the kernel-busy share of a torch.profiler trace of the same window.
The comparison logic is in tests/gpu/activity.py, tested on recorded inputs in
tests/unit/test_gpu_check_activity.py.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.activity import (
    GpmUnsupported,
    busy_share,
    counter_watts,
    gpm_window,
    in_window,
    kernel_intervals,
    mean_of,
    power_agrees,
    sampled_watts,
    sm_agrees,
)
from tests.gpu.conftest import observe

torch = pytest.importorskip("torch")
pynvml = pytest.importorskip("pynvml")

WIDTH, TOKENS, LAYERS = 8192, 16384, 6  # bf16 matrix products that fill every SM of a data-centre GPU


def _mlp() -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(LAYERS):  # made on the device: no 1.6 GB of fp32 weights initialised on the host first
        linear = torch.nn.Linear(WIDTH, WIDTH, bias=False, device="cuda", dtype=torch.bfloat16)
        layers += [linear, torch.nn.GELU()]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(TOKENS, WIDTH, device="cuda", dtype=torch.bfloat16)
    return model, opt, x


def _step(model: Any, opt: Any, x: Any) -> None:
    model(x).float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _handle() -> Any:
    from pitstop.probe.collectors.samplers import open_nvml

    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    nvml, handle, notes = open_nvml(
        index, None, str(getattr(props, "uuid", "")) or None, torch.cuda.get_device_name()
    )
    if handle is None:
        pytest.skip(f"no NVML handle for this GPU: {notes}")
    return nvml, handle


def _probe_window(steps: int = 80) -> Any:
    """About 5 s of window on an H100/H200: several of the probe's 1 Hz activity reads fall inside it."""
    model, opt, x = _mlp()

    def train() -> None:
        for _ in range(steps + 4):
            _step(model, opt, x)
        torch.cuda.synchronize()

    return observe(train, warmup=3, steps=steps)


def test_gpm_sm_tensor_and_dram_activity_in_the_probe(figure: Any) -> None:
    rank = _probe_window()
    act = rank.gpu_activity
    assert act is not None, f"no activity read: {rank.probe_errors}"
    samples = in_window(rank)
    figure("source", act.source)
    figure("window_s", round((rank.window_end_t or 0) - (rank.window_start_t or 0), 2))
    figure("samples", len(samples))
    figure("unsupported", act.unsupported)
    if act.source != "nvml gpm":
        pytest.skip(f"GPM not read on {torch.cuda.get_device_name()}: {rank.probe_errors or act.source}")
    means = {n: mean_of(samples, n) for n in ("sm_active", "sm_occupancy", "tensor_active", "dram_active")}
    for name, value in means.items():
        figure(name, None if value is None else round(value, 3))
    assert len(samples) >= 2, "fewer than two GPM reads inside the window"
    for name in ("sm_active", "tensor_active", "dram_active"):
        value = means[name]
        assert value is not None and 0.0 <= value <= 1.0, (name, value, act.unsupported)
    assert (means["sm_active"] or 0) >= 0.3  # large matrix products keep the SMs busy
    assert (means["tensor_active"] or 0) >= 0.05  # bf16 matrix products run on the tensor cores


def test_energy_counter_against_the_sampled_power(figure: Any) -> None:
    rank = _probe_window()
    samples = in_window(rank)
    counter_w, drawn_w = counter_watts(samples), sampled_watts(rank)
    figure("counter_w", None if counter_w is None else round(counter_w, 1))
    figure("sampled_w", None if drawn_w is None else round(drawn_w, 1))
    joules = [s.energy_j for s in samples if s.energy_j is not None]
    figure("joules", round(joules[-1] - joules[0], 1) if len(joules) > 1 else None)
    if not joules:
        pytest.skip(f"no energy counter on {torch.cuda.get_device_name()} (Volta and newer have it)")
    ok, why = power_agrees(counter_w, drawn_w)
    assert ok, why


def test_sm_activity_against_the_kernel_busy_share_of_a_trace(figure: Any) -> None:
    nvml, handle = _handle()
    model, opt, x = _mlp()
    for _ in range(3):  # warm-up outside the window: allocations, cuBLAS heuristics
        _step(model, opt, x)
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = Path(tmp) / "trace.json"
        with torch.profiler.profile(activities=activities) as prof:

            def work() -> None:
                for _ in range(25):
                    _step(model, opt, x)
                torch.cuda.synchronize()

            try:
                window = gpm_window(nvml, handle, work)
            except GpmUnsupported as exc:
                pytest.skip(str(exc))
            finally:
                nvml.nvmlShutdown()
        prof.export_chrome_trace(str(trace_path))
        trace = json.loads(trace_path.read_text())
    intervals = kernel_intervals(trace)
    busy = busy_share(intervals, window.seconds)
    sm = window.metrics.get("sm_active")
    figure("window_s", round(window.seconds, 3))
    figure("kernels", len(intervals))
    figure("kernel_busy", round(busy, 3))
    figure("sm_active", None if sm is None else round(sm, 3))
    figure("tensor_active", window.metrics.get("tensor_active"))
    figure("dram_active", window.metrics.get("dram_active"))
    figure("gpm_read_ms", round(window.read_ms, 3))  # the probe pays this once a second
    assert intervals, "the trace holds no kernels"
    ok, why = sm_agrees(sm, busy)
    assert ok, why
