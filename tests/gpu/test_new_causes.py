"""GPU-only checks of the new causes, on a real CUDA device (skipped without one; `make gpu-check` runs them):
throttle reasons and clocks read through real NVML, allocator counters from real ``memory_stats``, and the
fused optimizer's losses against the default one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from pitstop.diagnose import diagnose  # noqa: E402
from pitstop.probe.collectors.memory import AllocatorWatch  # noqa: E402
from pitstop.remedies import RemedyId, remedy  # noqa: E402
from pitstop.trials.request import FixReport, FixRequest  # noqa: E402
from tests.factories import profile, steps  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _busy(seconds_of_matmuls: int = 200) -> None:
    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(seconds_of_matmuls):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()


def test_clock_event_reasons_and_application_clock_via_real_nvml() -> None:
    pynvml = pytest.importorskip("pynvml")
    from pitstop.clock_reasons import HW_SLOWDOWN, SW_POWER_CAP, SW_THERMAL_SLOWDOWN
    from pitstop.probe.collectors.samplers import NvmlSampler, open_nvml

    assert (
        pynvml.nvmlClocksEventReasonSwPowerCap,
        pynvml.nvmlClocksThrottleReasonHwSlowdown,
        pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    ) == (SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL_SLOWDOWN)
    nvml, handle = open_nvml(torch.cuda.current_device(), None)
    sampler = NvmlSampler(nvml, handle, origin=0.0)
    _busy()
    sampler.sample_once()
    s = sampler.samples[-1]
    assert s.clock_reasons is not None and s.clock_reasons >= 0
    assert s.sm_clock and s.sm_clock > 0 and s.app_clock and s.app_clock > 0
    smi = shutil.which("nvidia-smi")
    if smi:  # the application clock nvidia-smi reports is the one read
        index = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
        out = subprocess.run(
            [smi, "-i", index, "--query-gpu=clocks.applications.graphics", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        if out.isdigit():
            assert abs(int(out) - s.app_clock) <= 15
    print(f"NVML: reasons=0x{s.clock_reasons:x} sm={s.sm_clock:.0f} MHz app={s.app_clock:.0f} MHz")


def test_allocator_counters_via_real_memory_stats() -> None:
    torch.cuda.synchronize()
    steady = AllocatorWatch()
    held = [torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")]
    for _ in range(10):  # same sizes every step: served from the cache
        held.pop()
        held.append(torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda"))
        steady.step()
    churn = AllocatorWatch()
    for i in range(10):  # growing blocks and empty_cache inside the loop: cudaMalloc and cudaFree each step
        held.pop()
        torch.cuda.empty_cache()
        held.append(torch.empty((64 + 8 * i) * 2**20, dtype=torch.uint8, device="cuda"))
        churn.step()
    calm = profile("cuda", steps(), util=90.0)
    steady.fill(calm.ranks[0].memory)
    thrash = profile("cuda", steps(), util=90.0)
    churn.fill(thrash.ranks[0].memory)
    assert calm.ranks[0].memory.window_device_allocs == 0
    m = thrash.ranks[0].memory
    assert m.window_device_allocs is not None and m.window_device_allocs >= 10
    assert m.window_device_frees is not None and m.window_device_frees >= 9
    assert "allocator_thrash" in {f.cause for f in diagnose(thrash).findings}
    assert "allocator_thrash" not in {f.cause for f in diagnose(calm).findings}
    print(f"memory_stats: {m.window_device_allocs} cudaMalloc, {m.window_device_frees} cudaFree in 10 steps")


def _losses(fused: bool) -> tuple[list[float], object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 32)).cuda()
    x, y = torch.randn(512, 256, device="cuda"), torch.randint(0, 32, (512,), device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(10):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses, opt


def test_fused_optimizer_gives_the_same_losses_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    from pitstop.probe.kernels import kernel_facts

    plain, opt = _losses(fused=False)
    facts = kernel_facts(opt, None, None)
    assert facts.optimizer_foreach is True and not facts.optimizer_fused  # torch's CUDA default
    for name in ("Adam", "AdamW", "SGD", "Adagrad"):
        monkeypatch.setattr(getattr(torch.optim, name), "__init__", getattr(torch.optim, name).__init__)
    report = FixReport(None)
    remedy(RemedyId.FUSED_OPTIMIZER).on_import()["torch.optim"](torch.optim, FixRequest(), report)
    fused, opt = _losses(fused=True)
    assert report.applied[RemedyId.FUSED_OPTIMIZER] == "AdamW(fused=True)"
    assert kernel_facts(opt, None, None).optimizer_fused is True
    worst = max(abs(a - b) / abs(b) for a, b in zip(fused, plain, strict=True))
    assert worst < 1e-4, (plain, fused)
    print(f"fused AdamW: max relative loss difference {worst:.2e} over 10 steps")


def test_expandable_segments_reach_a_fresh_process() -> None:
    script = textwrap.dedent("""
        import torch
        from pitstop.remedies import RemedyId, remedy
        from pitstop.trials.request import FixReport, FixRequest
        report = FixReport(None)
        remedy(RemedyId.EXPANDABLE_SEGMENTS).on_import()["torch"](torch, FixRequest(), report)
        x = torch.empty(2**26, device="cuda")
        segments = torch.cuda.memory._snapshot()["segments"]
        print(report.applied, all(s.get("is_expandable") for s in segments))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "expandable_segments:True" in out.stdout and out.stdout.strip().endswith("True"), out.stdout
