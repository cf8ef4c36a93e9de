"""The causes beyond the guide's first ten: each rule on hand-made profiles, and its remedy's advice."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import pytest
from tests.factories import profile, steps

from pitstop import cpus
from pitstop.clock_reasons import reason_names
from pitstop.core.findings import Finding
from pitstop.core.profile import (
    CpuThreads,
    GpuSample,
    HostSample,
    KernelFacts,
    MemoryStats,
    RunProfile,
    RunTotals,
    SaveStats,
)
from pitstop.diagnose import diagnose
from pitstop.probe.collectors.cpu_threads import machine_run_queue, runnable_threads
from pitstop.probe.collectors.memory import summarise
from pitstop.remedies import RemedyId, advise, remedy, use
from pitstop.trials.request import FixReport, FixRequest


def finding(p: RunProfile, cause: str) -> Finding | None:
    return next((f for f in diagnose(p).findings if f.cause == cause), None)


# -- checkpoint_stall ------------------------------------------------------------------------------------
def test_measured_saves_that_take_a_quarter_of_the_window_are_a_stall() -> None:
    p = profile("cpu", steps(n=20, wall=0.1), save_steps=5)
    p.ranks[0].checkpoints = SaveStats(
        saves=8, save_s=0.5, steps_with_saves=4, calls={"save_pretrained": 4, "torch.save": 4}
    )
    f = finding(p, "checkpoint_stall")
    assert f is not None
    assert f.evidence["save_frac"] == pytest.approx(0.25)
    assert f.evidence["checkpoints"] == 4 and f.evidence["steps_per_save"] == 5
    # save_steps 5 → 100: 95% of the save time goes
    assert f.est_speedup == pytest.approx(1 / (1 - 0.25 * 0.95), rel=1e-3)
    assert f.fix.uses[0].remedy is RemedyId.SAVE_LESS_OFTEN
    assert "save_steps=100" in (f.fix.snippet or "")


def test_saves_that_cost_little_or_none_are_no_finding() -> None:
    cheap = profile("cpu", steps(n=20, wall=0.1))
    cheap.ranks[0].checkpoints = SaveStats(saves=1, save_s=0.02, steps_with_saves=1)
    assert finding(cheap, "checkpoint_stall") is None
    none = profile("cpu", steps(n=20, wall=0.1))
    none.ranks[0].checkpoints = SaveStats()
    assert finding(none, "checkpoint_stall") is None


def test_trainer_outputs_give_an_estimate_labelled_as_one() -> None:
    # a 1.2B model saved 100 times in an hour: 100 × 12 bytes × 1.24e9 / 1 GB/s ≈ 1480 s of 3600
    p = RunProfile(
        source="trainer_state",
        totals=RunTotals(train_s=3600.0, steps=1000, saves=100),
        run_environment=dataclasses.replace(profile().environment, save_steps=10, device=None),
    )
    f = finding(p, "checkpoint_stall")
    assert f is not None and f.confidence < 0.5
    assert f.evidence["estimated_save_frac"] == pytest.approx(100 * 12 * 1_235_814_400 / 1e9 / 3600, rel=1e-3)
    assert "estimate" in f.speedup_basis and "estimate" in f.summary
    rare = dataclasses.replace(p, totals=RunTotals(train_s=3600.0, steps=1000, saves=1))
    assert finding(rare, "checkpoint_stall") is None


def test_tune_raises_the_trainers_save_steps() -> None:
    class Args:
        save_strategy = "steps"
        save_steps = 10

    report = FixReport(None)
    args = Args()
    remedy(RemedyId.SAVE_LESS_OFTEN).rewrite_training_args(args, FixRequest(), report)
    assert args.save_steps == 100
    assert report.params[RemedyId.SAVE_LESS_OFTEN] == {"save_steps": 10}
    kept = advise("hf_trainer", use(RemedyId.SAVE_LESS_OFTEN, **report.params[RemedyId.SAVE_LESS_OFTEN]))
    assert "every 100 steps instead of 10" in kept.text
    never = Args()
    never.save_strategy = "no"
    remedy(RemedyId.SAVE_LESS_OFTEN).rewrite_training_args(never, FixRequest(), report)
    assert never.save_steps == 10


# -- cpu_oversubscribed ----------------------------------------------------------------------------------
def _threads(**kw: object) -> CpuThreads:
    base: dict[str, object] = dict(cores_allowed=16, machine_cores=16, torch_threads=16, local_ranks=1)
    return CpuThreads(**{**base, **kw})  # type: ignore[arg-type]


def test_four_ranks_each_taking_every_core_are_oversubscribed() -> None:
    p = profile("cuda", steps(), util=90.0, cpu=_threads(local_ranks=4, runnable_threads=40.0))
    f = finding(p, "cpu_oversubscribed")
    assert f is not None and f.severity == "high" and f.confidence == 0.8
    assert f.evidence["thread_demand"] == 4 * (16 + 4)  # 4 workers each, counted whole without host samples
    assert f.evidence["suggested_threads"] == 1  # 16 cores / 4 ranks − 4 workers → 0 → at least 1
    assert "OMP_NUM_THREADS=1 torchrun --nproc_per_node=4" in (f.fix.snippets["pytorch"] or "")
    assert "OMP_NUM_THREADS is unset" in f.summary
    assert f.est_speedup is None and "not estimated" in f.speedup_basis
    assert "OMP_NUM_THREADS=1 torchrun --nproc_per_node=4" in (f.fix.snippets["pytorch"] or "")


def test_a_container_with_fewer_cores_than_the_machine() -> None:
    p = profile(
        "cpu", steps(), cpu=_threads(cores_allowed=4, machine_cores=64, cgroup_cores=4.0, torch_threads=64)
    )
    p.environment.dataloader = dataclasses.replace(p.environment.dataloader, num_workers=0)
    f = finding(p, "cpu_oversubscribed")
    assert f is not None and "(of the machine's 64)" in f.summary
    assert f.evidence["suggested_threads"] == 4 and f.confidence == 0.5  # nothing measured


def test_on_a_machine_others_keep_busy_capping_is_said_to_cost_the_jobs_share() -> None:
    """The scheduler shares cores per thread: where other processes alone fill the cores, fewer threads is a
    smaller share for the job (the calibration harness measured capping 8 threads to 2 at x0.09-x0.42 at load 7
    on 2 cores), so the finding says so and its confidence drops below a measured oversubscription's."""
    busy = _threads(
        cores_allowed=2, machine_cores=2, torch_threads=8, runnable_threads=2.5, machine_run_queue=6.6
    )
    p = profile("cpu", steps(), cpu=busy)
    p.environment.dataloader = dataclasses.replace(p.environment.dataloader, num_workers=0)
    f = finding(p, "cpu_oversubscribed")
    assert f is not None and f.evidence["others_runnable"] == 4.1
    assert "Other processes keep the cores busy too (4.1 runnable threads" in f.summary
    assert f.confidence == 0.4 and f.evidence["suggested_threads"] == 2
    alone = _threads(
        cores_allowed=2, machine_cores=2, torch_threads=8, runnable_threads=7.5, machine_run_queue=8.0
    )
    q = profile("cpu", steps(), cpu=alone)
    q.environment.dataloader = dataclasses.replace(q.environment.dataloader, num_workers=0)
    g = finding(q, "cpu_oversubscribed")
    assert g is not None and g.evidence["others_runnable"] == 0.5 and g.confidence == 0.8
    assert "Other processes" not in g.summary
    # the job's own other ranks are not "other processes", nor is load on cores outside its cpuset
    ranks4 = _threads(torch_threads=16, local_ranks=4, runnable_threads=20.0, machine_run_queue=80.0)
    r = finding(profile("cpu", steps(), cpu=ranks4), "cpu_oversubscribed")
    assert r is not None and r.evidence["others_runnable"] == 0.0 and r.confidence == 0.8
    cpuset = _threads(
        cores_allowed=4, machine_cores=64, torch_threads=64, runnable_threads=4.5, machine_run_queue=40.5
    )
    c = finding(profile("cpu", steps(), cpu=cpuset), "cpu_oversubscribed")
    assert c is not None and c.evidence["others_runnable"] == 2.25 and "Other processes" not in c.summary


def test_threads_that_fit_are_no_finding() -> None:
    fits = profile("cpu", steps(), cpu=_threads(torch_threads=12))  # 12 + 4 workers on 16 cores
    assert finding(fits, "cpu_oversubscribed") is None
    light_workers = profile("cpu", steps(), cpu=_threads(cores_allowed=2, torch_threads=2))
    light_workers.ranks[0].host_samples = [
        HostSample(t=i, main_cpu_pct=190, workers_cpu_pct=5, workers=4) for i in range(5)
    ]
    assert finding(light_workers, "cpu_oversubscribed") is None  # 2 + 0.05 busy worker cores on 2 cores
    unknown = profile("cpu", steps())
    assert finding(unknown, "cpu_oversubscribed") is None  # no thread facts (an offline source)


def test_cgroup_quota_v1_and_v2(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    v2 = tmp_path / "v2"
    (v2 / "job").mkdir(parents=True)
    (v2 / "job" / "cpu.max").write_text("250000 100000\n")
    (tmp_path / "proc" / "cgroup").write_text("0::/job\n")
    assert cpus.cgroup_cores(v2, tmp_path / "proc" / "cgroup") == 2.5
    (v2 / "job" / "cpu.max").write_text("max 100000\n")
    assert cpus.cgroup_cores(v2, tmp_path / "proc" / "cgroup") is None
    v1 = tmp_path / "v1"
    (v1 / "cpu" / "docker").mkdir(parents=True)
    (v1 / "cpu" / "docker" / "cpu.cfs_quota_us").write_text("300000")
    (v1 / "cpu" / "docker" / "cpu.cfs_period_us").write_text("100000")
    (tmp_path / "proc" / "cgroup").write_text("4:memory:/x\n1:cpu,cpuacct:/docker\n0::/\n")
    assert cpus.cgroup_cores(v1, tmp_path / "proc" / "cgroup") == 3.0


def test_runnable_threads_are_read_from_proc(tmp_path: Path) -> None:
    task = tmp_path / "7" / "task"
    for tid, state in ((7, "R"), (8, "S"), (9, "R")):
        (task / str(tid)).mkdir(parents=True)
        (task / str(tid) / "stat").write_text(f"{tid} (python (main)) {state} 1 2 3")
    assert runnable_threads(7, tmp_path) == 2
    (tmp_path / "stat").write_text("cpu 1 2 3\nprocs_running 5\nprocs_blocked 0\n")
    assert machine_run_queue(tmp_path) == 5


def test_trial_caps_the_jobs_own_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(cpus, "affinity_cores", lambda: 4)
    monkeypatch.setattr(cpus, "cgroup_cores", lambda *a: None)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    before = torch.get_num_threads()
    original = torch.set_num_threads
    report = FixReport(None)
    try:
        remedy(RemedyId.CPU_THREADS).on_import()["torch"](torch, FixRequest(), report)
        assert torch.get_num_threads() == 2  # 4 cores / 2 ranks
        torch.set_num_threads(8)  # the job asks for more
        assert torch.get_num_threads() == 2
    finally:
        monkeypatch.setattr(torch, "set_num_threads", original)
        original(before)
    kept = advise("pytorch", use(RemedyId.CPU_THREADS, **report.params[RemedyId.CPU_THREADS]))
    assert (
        "OMP_NUM_THREADS=2 torchrun --nproc_per_node=2" in (kept.snippet or "")
        and "4 cores / 2 processes" in kept.text
    )


# -- unfused_kernels -------------------------------------------------------------------------------------
def _kernels(**kw: object) -> KernelFacts:
    base: dict[str, object] = dict(
        optimizer="AdamW",
        optimizer_fused=False,
        optimizer_foreach=False,
        liger_installed=False,
        liger_applied=False,
    )
    return KernelFacts(**{**base, **kw})  # type: ignore[arg-type]


def test_large_vocabulary_loss_and_a_for_loop_optimizer_on_a_gpu() -> None:
    # Llama-3.2-1B shape (vocabulary 128,256), 8 × 1024 tokens, 0.1 s steps with 5 ms optimizer on an H100
    p = profile("cuda", steps(), util=95.0, kernels=_kernels())
    f = finding(p, "unfused_kernels")
    assert f is not None
    gib = 2**30
    tokens = 8 * 1024
    # fp32 logits, their log-softmax and the gradient made from it: 12 bytes per vocabulary entry (plan/memory.py)
    assert f.evidence["logits_gib_per_micro_batch"] == pytest.approx(tokens * 12 * 128256 / gib, abs=0.01)
    assert f.evidence["fused_loss_gib_per_micro_batch"] == pytest.approx(tokens * 2 * 128256 / gib, abs=0.01)
    traffic_s = 2 * tokens * 10 * 128256 / (3.35e12 * 0.8)  # H100 SXM: 3.35 TB/s; 12 - 2 bytes removed
    assert f.evidence["estimated_loss_traffic_frac"] == pytest.approx(traffic_s / 0.1, rel=0.05)
    assert f.evidence["optimizer_impl"] == "for-loop" and f.evidence["optimizer_frac"] == pytest.approx(0.05)
    assert "estimate from the planner's bytes model" in f.speedup_basis and "assumed ×4" in f.speedup_basis
    assert [u.remedy for u in f.fix.uses] == [
        RemedyId.FUSED_OPTIMIZER,
        RemedyId.LIGER_KERNELS,
        RemedyId.COMPILE_MODEL,
    ]
    assert "pip install liger-kernel" in f.fix.text
    assert 'optim="adamw_torch_fused"' in (f.fix.snippet or "")


def test_fused_paths_already_taken_are_no_finding() -> None:
    done = profile("cuda", steps(), util=95.0, kernels=_kernels(optimizer_fused=True, liger_applied=True))
    assert finding(done, "unfused_kernels") is None
    small_vocab = profile("cuda", steps(), util=95.0, kernels=_kernels(optimizer_foreach=True))
    small_vocab.environment.model = dataclasses.replace(small_vocab.environment.model, vocab_size=32)
    assert finding(small_vocab, "unfused_kernels") is None  # foreach optimizer at 5%: below the bar
    on_cpu = profile("cpu", steps(), kernels=_kernels())
    assert finding(on_cpu, "unfused_kernels") is None
    assert finding(profile("cuda", steps(), util=95.0), "unfused_kernels") is None  # kernels unknown


def test_installed_liger_not_applied_is_named_for_its_models() -> None:
    p = profile("cuda", steps(), util=95.0, kernels=_kernels(optimizer_fused=True, liger_installed=True))
    p.environment.model = dataclasses.replace(p.environment.model, vocab_size=32)
    f = finding(p, "unfused_kernels")
    assert f is not None and "RMSNorm, RoPE and SwiGLU" in f.summary and f.est_speedup is None
    assert f.fix.uses[0].remedy is RemedyId.LIGER_KERNELS
    assert "use_liger_kernel=True" in (f.fix.snippet or "")


def _tiny_losses(optim_module: object | None, fused_patch: bool, steps_n: int = 5) -> list[float]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    assert bool(opt.defaults.get("fused")) is fused_patch
    losses = []
    for _ in range(steps_n):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def test_fused_optimizer_trial_gives_the_same_losses(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    plain = _tiny_losses(None, fused_patch=False)
    for name in ("Adam", "AdamW", "SGD", "Adagrad"):
        monkeypatch.setattr(getattr(torch.optim, name), "__init__", getattr(torch.optim, name).__init__)
    report = FixReport(None)
    remedy(RemedyId.FUSED_OPTIMIZER).on_import()["torch.optim"](torch.optim, FixRequest(), report)
    fused = _tiny_losses(None, fused_patch=True)
    assert report.applied[RemedyId.FUSED_OPTIMIZER] == "AdamW(fused=True)"
    assert fused == pytest.approx(plain, rel=1e-5)
    assert plain[-1] < plain[0]
    explicit = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), foreach=False)
    assert not explicit.defaults.get("fused")  # the job's own choice stands
    assert remedy(RemedyId.FUSED_OPTIMIZER).preserves_computation


def test_kernel_facts_of_real_optimizers() -> None:
    import torch

    from pitstop.probe.kernels import kernel_facts

    params = list(torch.nn.Linear(4, 4).parameters())
    loop = kernel_facts(torch.optim.AdamW(params), None, None)
    assert (
        loop.optimizer == "AdamW" and loop.optimizer_foreach is False and not loop.optimizer_fused
    )  # CPU default
    fused = kernel_facts(torch.optim.AdamW(params, fused=True), None, None)
    assert fused.optimizer_fused is True and fused.optimizer_foreach is False


def test_compile_and_liger_trials_patch_the_first_hf_model(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    import torch

    model = torch.nn.Linear(2, 2)
    report = FixReport(None)
    remedy(RemedyId.COMPILE_MODEL).on_first_forward(model, FixRequest(), report)
    assert getattr(model.forward, "_torchdynamo_orig_callable", None) is not None
    assert RemedyId.COMPILE_MODEL in report.applied
    seen: list[object] = []
    fake = types.ModuleType("liger_kernel.transformers")
    fake._apply_liger_kernel_to_instance = lambda model: seen.append(model)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", fake)
    remedy(RemedyId.LIGER_KERNELS).on_first_forward(model, FixRequest(), report)
    assert seen == [model] and RemedyId.LIGER_KERNELS in report.applied


# -- allocator_thrash ------------------------------------------------------------------------------------
GIB = 2**30


def _stats(
    step: int, retries: int, allocs: int, frees: int, reserved: float, allocated: float
) -> dict[str, int]:
    """A torch.cuda.memory_stats() dict as torch writes it (flat dotted keys), with the counters we read."""
    return {
        "active.all.current": 400 + step,
        "allocated_bytes.all.current": int(allocated * GIB),
        "allocated_bytes.all.peak": int(allocated * GIB * 1.2),
        "inactive_split_bytes.all.current": int((reserved - allocated) * GIB * 0.8),
        "num_alloc_retries": retries,
        "num_device_alloc": allocs,
        "num_device_free": frees,
        "num_ooms": 0,
        "reserved_bytes.all.current": int(reserved * GIB),
        "requested_bytes.all.current": int(allocated * GIB),
    }


def _thrashing(n: int = 12) -> list[dict[str, int]]:
    # each step: 2 cudaMalloc, 2 cudaFree, a retry every 3 steps; 77 of 80 GiB reserved for ~45 GiB of tensors
    return [_stats(i, 10 + i // 3, 500 + 2 * i, 300 + 2 * i, 77.0, 45.0 + (i % 2)) for i in range(n + 1)]


def test_memory_stats_of_a_window_are_summarised() -> None:
    memory = MemoryStats()
    summarise(_thrashing(), memory)
    assert memory.window_steps == 12
    assert (
        memory.window_alloc_retries == 4
        and memory.window_device_allocs == 24
        and memory.window_device_frees == 24
    )
    assert memory.steps_with_device_allocs == 12
    assert memory.reserved_mean == pytest.approx(77 * GIB, rel=1e-6)
    assert memory.allocated_mean == pytest.approx(45.5 * GIB, rel=0.02)
    steady = MemoryStats()
    summarise([_stats(i, 0, 500, 300, 40.0, 30.0) for i in range(13)], steady)
    assert steady.window_device_allocs == 0 and steady.steps_with_device_allocs == 0
    one = MemoryStats()
    summarise([_stats(0, 0, 1, 1, 1, 1)], one)
    assert one.window_steps is None  # a single snapshot is no window


def test_allocator_retries_and_churn_near_full_memory_are_thrash() -> None:
    p = profile("cuda", steps(), util=90.0)
    summarise(_thrashing(), p.ranks[0].memory)
    f = finding(p, "allocator_thrash")
    assert f is not None
    assert f.evidence["alloc_retries"] == 4 and f.evidence["cuda_mallocs"] == 24
    assert f.evidence["near_full"] is True and f.evidence["reserved_over_allocated"] == pytest.approx(
        77 / 45.5, rel=0.02
    )
    # (48 calls × 1 ms + 4 retries × 20 ms) / 12 steps = 10.7 ms of a 100 ms step
    assert f.est_speedup == pytest.approx(1 / (1 - 0.128 / 12 / 0.1), rel=1e-3)
    assert "assumed 1 ms per cudaMalloc" in f.speedup_basis
    assert "expandable_segments:True" in f.fix.text and "halving the micro-batch" in f.fix.text


def test_a_steady_allocator_is_no_finding() -> None:
    p = profile("cuda", steps(), util=90.0)
    summarise([_stats(i, 3, 500, 300, 40.0, 30.0) for i in range(13)], p.ranks[0].memory)  # old retries only
    assert finding(p, "allocator_thrash") is None
    cpu = profile("cpu", steps())
    summarise(_thrashing(), cpu.ranks[0].memory)
    assert finding(cpu, "allocator_thrash") is None


def test_expandable_segments_trial_sets_the_allocator_before_cuda_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import types

    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.setenv(var, "")  # so that monkeypatch restores what the hook writes
        monkeypatch.delenv(var)
    settings: list[str] = []
    fake = types.SimpleNamespace(
        cuda=types.SimpleNamespace(
            is_initialized=lambda: False,
            memory=types.SimpleNamespace(_set_allocator_settings=settings.append),
        )
    )
    report = FixReport(None)
    hook = remedy(RemedyId.EXPANDABLE_SEGMENTS).on_import()["torch"]
    hook(fake, FixRequest(), report)
    import os

    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True" and not settings
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    fake.cuda.is_initialized = lambda: True
    hook(fake, FixRequest(), FixReport(None))
    assert settings == ["expandable_segments:True"]


# -- gpu_throttled ---------------------------------------------------------------------------------------
class FakePynvml:
    """pynvml's reading functions by their real names; ``legacy`` has only the pre-535 throttle-reasons name."""

    NVML_CLOCK_SM = 1
    nvmlClocksEventReasonSwPowerCap = 0x4
    nvmlClocksThrottleReasonHwSlowdown = 0x8
    nvmlClocksEventReasonSwThermalSlowdown = 0x20

    def __init__(self, reasons: int, sm: int, app: int, legacy: bool = False) -> None:
        self.reasons, self.sm, self.app = reasons, sm, app
        if legacy:
            self.nvmlDeviceGetCurrentClocksThrottleReasons = lambda handle: self.reasons

    def __getattr__(self, name: str) -> object:
        raise AttributeError(name)  # a function this pynvml lacks

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> object:
        return types.SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> object:
        return types.SimpleNamespace(used=60 * GIB, total=80 * GIB, free=20 * GIB)

    def nvmlDeviceGetPcieThroughput(self, handle: object, counter: int) -> int:
        return 1000

    def nvmlDeviceGetClockInfo(self, handle: object, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return self.sm

    def nvmlDeviceGetPowerUsage(self, handle: object) -> int:
        return 700_000

    def nvmlDeviceGetApplicationsClock(self, handle: object, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return self.app


def test_the_nvml_sampler_reads_clock_event_reasons_and_the_application_clock() -> None:
    from pitstop.probe.collectors.samplers import NvmlSampler

    current = FakePynvml(0x4 | 0x20, sm=1410, app=1755)
    current.nvmlDeviceGetCurrentClocksEventReasons = lambda handle: current.reasons  # type: ignore[attr-defined]
    sampler = NvmlSampler(current, handle=object(), origin=0.0)
    sampler.sample_once()
    s = sampler.samples[0]
    assert (s.clock_reasons, s.sm_clock, s.app_clock, s.power_w) == (0x24, 1410.0, 1755.0, 700.0)
    old = NvmlSampler(FakePynvml(0x8, sm=1000, app=1755, legacy=True), handle=object(), origin=0.0)
    old.sample_once()
    assert old.samples[0].clock_reasons == 0x8
    assert reason_names(0x24 | 0x1) == ["SW power cap", "SW thermal slowdown"]  # idle is not throttling


def _clocked(util: float, reasons: int, sm: float, app: float = 1755.0, n: int = 20) -> list[GpuSample]:
    return [
        GpuSample(t=0.1 * i, util=util, sm_clock=sm, app_clock=app, clock_reasons=reasons if i % 4 else 0)
        for i in range(n)
    ]


def test_one_power_capped_gpu_of_two_is_throttled() -> None:
    p = profile("cuda", steps(), util=95.0, ranks=2)
    p.ranks[0].gpu_samples = _clocked(95.0, 0, 1980.0)
    p.ranks[1].gpu_samples = _clocked(95.0, 0x4 | 0x40, 1200.0)
    f = finding(p, "gpu_throttled")
    assert f is not None and f.evidence["throttled_ranks"] == [1]
    gpu = f.evidence["gpus"]["1"]  # type: ignore[index]
    assert gpu["reasons"] == ["SW power cap", "HW thermal slowdown"] and gpu["throttled_frac"] == 0.75
    assert gpu["clock_ratio"] == pytest.approx(1200 / 1755, abs=1e-3)
    assert f.evidence["gpus"]["0"]["throttled_frac"] == 0  # type: ignore[index]
    assert "others wait" in f.summary and f.severity == "high"
    assert (
        "CUDA_VISIBLE_DEVICES" in f.fix.text and "power limit" in f.fix.text and "temperatures" in f.fix.text
    )


def test_clocks_at_speed_or_idle_gpus_are_not_throttled() -> None:
    boosting = profile("cuda", steps(), util=95.0)
    boosting.ranks[0].gpu_samples = _clocked(95.0, 0x4, 1700.0)  # power cap flagged, clock within 10%
    assert finding(boosting, "gpu_throttled") is None
    idle = profile("cuda", steps(), util=95.0)
    idle.ranks[0].gpu_samples = _clocked(5.0, 0x20, 600.0)  # thermal at idle: nothing to slow
    assert finding(idle, "gpu_throttled") is None
    unread = profile("cuda", steps(), util=95.0)  # samples without reasons (an older recording)
    assert finding(unread, "gpu_throttled") is None


def test_recorded_nvml_replays_the_new_fields() -> None:
    from pitstop.probe.collectors.samplers import NvmlSampler, RecordedNvml

    reading = {
        "util": 99,
        "mem_used": 1,
        "mem_total": 2,
        "sm_clock": 1100,
        "clock_reasons": 0x8,
        "app_clock": 1755,
    }
    sampler = NvmlSampler(RecordedNvml([reading]), handle=None, origin=0.0)
    sampler.sample_once()
    assert (sampler.samples[0].clock_reasons, sampler.samples[0].app_clock) == (0x8, 1755.0)


def test_reason_bits_are_nvmls() -> None:
    pynvml = pytest.importorskip("pynvml")
    from pitstop import clock_reasons as cr

    assert pynvml.nvmlClocksEventReasonSwPowerCap == cr.SW_POWER_CAP
    assert pynvml.nvmlClocksEventReasonHwSlowdown == cr.HW_SLOWDOWN
    assert pynvml.nvmlClocksEventReasonSwThermalSlowdown == cr.SW_THERMAL_SLOWDOWN
    assert pynvml.nvmlClocksEventReasonHwThermalSlowdown == cr.HW_THERMAL_SLOWDOWN
    assert pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown == cr.HW_POWER_BRAKE_SLOWDOWN
    assert pynvml.nvmlClocksEventReasonGpuIdle == cr.GPU_IDLE


def test_the_new_fields_survive_a_saved_profile() -> None:
    p = profile("cuda", steps(), util=90.0, cpu=_threads(runnable_threads=3.5), kernels=_kernels())
    p.ranks[0].checkpoints = SaveStats(saves=2, save_s=0.5, steps_with_saves=1, calls={"torch.save": 2})
    p.ranks[0].gpu_samples = _clocked(95.0, 0x4, 1200.0)
    summarise(_thrashing(), p.ranks[0].memory)
    back = RunProfile.from_dict(p.to_dict())
    assert back == p
    old = p.to_dict()
    del old["ranks"][0]["checkpoints"]
    assert RunProfile.from_dict(old).ranks[0].checkpoints is None  # files from before these fields still load


def test_the_probe_times_saves_in_the_window_and_reads_threads_and_kernels(tmp_path: Path) -> None:
    import torch

    from pitstop.integrations.loop import watch

    original_save = torch.save
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32), torch.randint(0, 8, (16,))
    with watch(steps=8, warmup=2, report=False) as session:
        for step in range(1, 11):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            if step % 2 == 0:  # after steps 2, 4, 6, 8: inside measured steps 3–10; after 10: past the window
                torch.save(model.state_dict(), tmp_path / "model.pt")
                torch.save(opt.state_dict(), tmp_path / "optimizer.pt")
    assert torch.save is original_save  # restored
    assert session.diagnosis is not None
    rank = session.diagnosis.profile.ranks[0]
    assert rank.checkpoints is not None
    assert rank.checkpoints.calls == {"torch.save": 8} and rank.checkpoints.steps_with_saves == 4
    assert rank.checkpoints.save_s > 0
    env = rank.environment
    assert env.cpu is not None and env.cpu.torch_threads == torch.get_num_threads()
    assert env.cpu.cores_allowed is not None and env.cpu.cores_allowed >= 1
    assert env.cpu.runnable_threads is not None  # sampled at least once from /proc
    assert env.kernels is not None and env.kernels.optimizer == "AdamW"
    assert env.kernels.optimizer_foreach is False and not env.kernels.optimizer_fused  # torch's CPU default


SMI_LOG = """\
timestamp, index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB], clocks.sm [MHz], \
clocks.applications.graphics [MHz], clocks_event_reasons.active
2026/11/30 10:00:00.000, 0, NVIDIA H100 80GB HBM3, 98 %, 70000 MiB, 81559 MiB, 1980 MHz, 1755 MHz, 0x0000000000000000
2026/11/30 10:00:00.000, 1, NVIDIA H100 80GB HBM3, 97 %, 70000 MiB, 81559 MiB, 1095 MHz, 1755 MHz, 0x0000000000000024
2026/11/30 10:00:01.000, 0, NVIDIA H100 80GB HBM3, 99 %, 70000 MiB, 81559 MiB, 1980 MHz, 1755 MHz, 0x0000000000000000
2026/11/30 10:00:01.000, 1, NVIDIA H100 80GB HBM3, 98 %, 70000 MiB, 81559 MiB, 1110 MHz, 1755 MHz, 0x0000000000000004
2026/11/30 10:00:02.000, 0, NVIDIA H100 80GB HBM3, 99 %, 70000 MiB, 81559 MiB, 1965 MHz, 1755 MHz, [N/A]
2026/11/30 10:00:02.000, 1, NVIDIA H100 80GB HBM3, 98 %, 70000 MiB, 81559 MiB, 1100 MHz, 1755 MHz, 0x0000000000000024
"""


def test_an_nvidia_smi_log_with_clock_event_reasons_names_the_throttled_gpu(tmp_path: Path) -> None:
    from pitstop.ingest.load import Inputs, load_run

    log = tmp_path / "gpus.csv"
    log.write_text(SMI_LOG)
    f = finding(load_run(Inputs(paths=[log])), "gpu_throttled")
    assert f is not None and f.evidence["throttled_ranks"] == [1]
    gpus = f.evidence["gpus"]
    assert gpus["1"]["reasons"] == ["SW power cap", "SW thermal slowdown"]  # type: ignore[index]
    assert gpus["1"]["app_clock_mhz"] == 1755 and gpus["1"]["mean_sm_clock_mhz"] == 1102  # type: ignore[index]
    assert gpus["0"]["busy_samples"] == 2  # the [N/A] reading has no reasons  # type: ignore[index]
