"""The GPU code paths, checked on a CPU against the exact shapes of the APIs they call (issue 19).

Where the CPU build has the real call it is used; elsewhere the test stands in for torch.cuda / pynvml with
objects that have the real function names and return shapes. `tests/gpu/` confirms the same on a GPU.
"""

from __future__ import annotations

import itertools
import pickle
import types
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pitstop.core.profile import Environment  # noqa: E402
from pitstop.core.vocabulary import Device  # noqa: E402
from pitstop.hardware import lookup_gpu  # noqa: E402
from pitstop.plan.flops import attention_context, flops_per_token  # noqa: E402
from pitstop.probe import environment as envmod  # noqa: E402
from pitstop.probe.collectors import samplers  # noqa: E402
from pitstop.probe.collectors.memory import memory_stats  # noqa: E402
from pitstop.probe.config import ProbeConfig  # noqa: E402
from pitstop.probe.hooks import SYNC_WARNING, Hooks  # noqa: E402
from pitstop.probe.probe import CudaEventClock, Probe  # noqa: E402

CUDA1 = torch.device("cuda", 1)


class _FakeTensor:
    """What compute_device reads of a parameter: its device."""

    def __init__(self, device: Any, requires_grad: bool = True) -> None:
        self.device = device
        self.requires_grad = requires_grad


class _FakeModel:
    def __init__(self, params: list[Any], buffers: list[Any] | None = None) -> None:
        self._params, self._buffers = params, buffers or []

    def parameters(self) -> Any:
        return iter(self._params)

    def buffers(self) -> Any:
        return iter(self._buffers)


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, name: str = "NVIDIA H100 80GB HBM3") -> dict[str, list[Any]]:
    calls: dict[str, list[Any]] = {}

    def record(fn: str, result: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.setdefault(fn, []).append(args)
            return result(*args) if callable(result) else result

        return call

    props = types.SimpleNamespace(total_memory=85_520_809_984, pci_bus_id=0x18, pci_device_id=0, uuid="x")
    monkeypatch.setattr(torch.cuda, "get_device_properties", record("get_device_properties", props))
    monkeypatch.setattr(torch.cuda, "get_device_name", record("get_device_name", name))
    monkeypatch.setattr(torch.cuda, "device_count", record("device_count", 2))
    monkeypatch.setattr(torch.cuda, "current_device", record("current_device", 0))
    return calls


# -- item 1: the device is where the model computes ------------------------------------------------------
def test_a_gpu_run_with_its_optimizer_offloaded_to_the_cpu_is_a_gpu_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _fake_cuda(monkeypatch)
    model = _FakeModel([_FakeTensor(CUDA1) for _ in range(3)])
    cpu_partitions = [torch.zeros(4, requires_grad=True) for _ in range(3)]  # ZeRO-Offload's CPU Adam params
    optimizer = torch.optim.SGD(cpu_partitions, lr=0.1)
    env = Environment()
    device = envmod.compute_device(model, envmod.optimizer_params(optimizer))
    envmod.device_facts(device, env)
    envmod.offload_and_zero(None, optimizer, env)
    assert device == CUDA1 and env.device == "cuda" and env.gpu_name == "NVIDIA H100 80GB HBM3"
    assert calls["get_device_properties"] == [(1,)]  # the model's GPU, not the current one
    assert env.offload == {"optimizer": "cpu"}  # the optimizer's place stays its own fact


def test_a_model_held_only_in_buffers_or_unknown_falls_back_to_the_optimizer() -> None:
    params = [torch.zeros(2, requires_grad=True)]
    assert envmod.compute_device(None, params) == torch.device("cpu")
    assert envmod.compute_device(_FakeModel([], [_FakeTensor(CUDA1)]), params) == CUDA1


def test_the_gpus_a_model_lies_on_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    # a device map over cuda:0–2 with the embeddings' buffer on cuda:0 and a CPU-offloaded optimizer state
    _fake_cuda(monkeypatch)
    layers = [_FakeTensor(torch.device("cuda", i)) for i in (0, 1, 1, 2)]
    model = _FakeModel(layers, [_FakeTensor(torch.device("cuda", 0)), _FakeTensor(torch.device("meta"))])
    assert envmod.gpus_held(model, [torch.zeros(2, requires_grad=True)]) == 3
    # "cuda" without an index is the current device, the same GPU as cuda:0 here
    assert (
        envmod.gpus_held(
            _FakeModel([_FakeTensor(torch.device("cuda")), _FakeTensor(torch.device("cuda", 0))]), []
        )
        == 1
    )
    assert envmod.gpus_held(None, [torch.zeros(2)]) is None  # a CPU run holds none


# -- item 7: timing and memory on the model's device -----------------------------------------------------
def test_cuda_marks_and_memory_are_read_on_the_model_device(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded: list[Any] = []

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.enable_timing = enable_timing

        def record(self, stream: Any = None) -> None:
            recorded.append(stream)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: ("stream of", device))
    CudaEventClock(CUDA1).mark()
    assert recorded == [("stream of", CUDA1)]  # not GPU 0's current stream

    asked: list[Any] = []
    monkeypatch.setattr(
        torch.cuda, "memory_stats", lambda device=None: asked.append(device) or {"num_ooms": 0}
    )
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: asked.append(device) or 7)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: asked.append(device) or 9)
    stats = memory_stats(Environment(device=Device.CUDA), CUDA1)
    assert asked == [CUDA1, CUDA1, CUDA1] and stats.peak_allocated == 7 and stats.peak_reserved == 9


# -- item 2: parameters counted as they are, not as they are stored -------------------------------------
class Params4bit(torch.nn.Parameter):
    """bitsandbytes' 4-bit weight: two values per byte of its uint8 storage."""


def test_4bit_quantized_weights_count_their_real_size() -> None:
    model = torch.nn.Module()
    model.q = Params4bit(torch.zeros(32, dtype=torch.uint8), requires_grad=False)  # 64 weights, packed
    model.lora = torch.nn.Linear(4, 2, bias=False)
    opt = torch.optim.SGD(model.lora.parameters(), lr=0.1)
    info = envmod.model_info(model, opt)
    assert info.params_total == 64 + 8 and info.params_trainable == 8


def test_mixture_of_experts_flops_count_only_the_active_experts() -> None:
    transformers = pytest.importorskip("transformers")
    from pitstop.plan.params import count_params

    cfg = dict(
        model_type="mixtral",
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    info = envmod.model_info(model, opt)
    experts = 2 * 4 * 3 * 32 * 48  # layers × experts × (gate, up, down) × d × inter
    assert (info.n_experts, info.experts_active, info.params_inactive) == (4, 2, experts // 2)
    assert count_params(cfg).inactive == experts // 2  # the planner counts the same
    fpt = flops_per_token(info, None)
    assert fpt is not None
    assert fpt.dense == 6 * (info.params_total - info.params_embedding - experts // 2)  # type: ignore[operator]


def test_mixtral_8x7b_plan_is_about_84_gflop_per_token_not_286() -> None:
    from pitstop.plan.model_shape import model_info_from_config
    from pitstop.plan.params import resolve_model

    info = model_info_from_config(resolve_model("mixtral-8x7b")[1])
    fpt = flops_per_token(info, 4096.0)
    assert fpt is not None and 80e9 < fpt.total < 88e9


@pytest.mark.slow
def test_fsdp1_counts_the_whole_model_not_the_local_shard() -> None:
    import json
    import subprocess
    import sys

    script = Path(__file__).parents[1] / "scripts" / "fsdp1_counts.py"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    whole = 100 * 8 + 8 * 8 + 8
    for total, trainable, embedding, local in json.loads(proc.stdout.strip().splitlines()[-1]):
        assert local == whole // 2  # what model.parameters() holds on a rank: the shard
        assert (total, trainable, embedding) == (whole, whole, 800)


# -- item 2: MIG --------------------------------------------------------------------------------------------
def test_a_mig_slice_is_planned_as_the_slice() -> None:
    full = lookup_gpu("NVIDIA A100-SXM4-40GB")
    mig = lookup_gpu("NVIDIA A100-SXM4-40GB MIG 1g.5gb")
    assert full is not None and mig is not None and mig.mig == "1g.5gb"
    assert mig.peak_flops("bf16") == pytest.approx(full.peak_flops("bf16") * 14 / 108, rel=1e-3)  # type: ignore[operator]
    assert mig.memory_mib == 4864  # what the driver reports for 1g.5gb, not 40 GiB
    h100 = lookup_gpu("NVIDIA H100 80GB HBM3 MIG 3g.40gb")
    assert h100 is not None and h100.key.startswith("H100-SXM MIG")


class FakePynvml:
    """pynvml's module surface for one A100 in MIG mode with two slices (names and returns as pynvml's)."""

    NVMLError = RuntimeError

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.slices = {
            0: "MIG-11111111-2222-3333-4444-555555555555",
            2: "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
        }

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByPciBusId(self, bus: bytes) -> Any:
        return ("parent", bus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return ("parent", index)

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        return [1, 1]  # [current, pending]: enabled

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        if index not in self.slices:
            raise self.NVMLError("Not Found")
        return ("mig", index)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self.slices[handle[1]]

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        if handle[0] == "mig":
            raise self.NVMLError("Not Supported")
        return types.SimpleNamespace(gpu=50, memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        total = 4864 * 2**20 if handle[0] == "mig" else 40960 * 2**20
        return types.SimpleNamespace(total=total, used=1 << 30, free=total - (1 << 30))


def test_nvml_samples_the_mig_slice_and_says_what_it_cannot_measure(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakePynvml()
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    uuid = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"  # the CUDA UUID of slice 2, as torch prints it
    nvml, handle, notes = samplers.open_nvml(0, "00000000:18:00.0", uuid, "NVIDIA A100-SXM4-40GB MIG 1g.5gb")
    assert handle == ("mig", 2) and notes == [samplers.MIG_UNMEASURED]
    sampler = samplers.NvmlSampler(nvml, handle, 0.0, owns_nvml=True)
    sampler.sample_once()
    sample = sampler.samples[0]
    assert sample.util is None and sample.mem_total == 4864 * 2**20  # the slice's memory, no fake utilization
    sampler.stop()
    assert fake.calls == ["init", "shutdown"]
    _, none, why = samplers.open_nvml(0, None, "00000000-0000-0000-0000-000000000000", None)
    assert none is None and "MIG slice" in why[0] and fake.calls[-1] == "shutdown"


# -- item 9: the NVML sampler's real rate and its shutdown --------------------------------------------------
def test_nvml_sampler_keeps_ten_hertz_although_pcie_queries_block() -> None:
    now = [0.0]

    class SlowPcie(samplers.RecordedNvml):
        def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> Any:
            now[0] += 0.020  # each PCIe counter read blocks ~20 ms on a real GPU
            return super().nvmlDeviceGetPcieThroughput(handle, counter)

        def nvmlShutdown(self) -> None:
            now[0] = -1.0

    reading = {"util": 50, "mem_used": 1, "mem_total": 2, "pcie_rx_kbs": 1, "pcie_tx_kbs": 1}
    sampler = samplers.NvmlSampler(SlowPcie([reading]), None, 0.0, interval_s=0.1, clock=lambda: now[0])

    def wait(seconds: float) -> None:
        now[0] += seconds

    sampler.run_until(lambda: len(sampler.samples) >= 20, wait)
    times = [s.t for s in sampler.samples]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps == pytest.approx([0.1] * 19)  # not 0.14 (0.1 after 40 ms of PCIe reads)


# -- item 3: every host sync counted, with its call site ----------------------------------------------------
class _Recorder:
    def __init__(self) -> None:
        self.syncs: list[tuple[float | None, str, str]] = []
        self.copies: list[tuple[bool, bool]] = []
        self.steps = 0

    def guard(self, fn: Any, *args: Any) -> None:
        fn(*args)

    def on_sync(self, seconds: float | None, kind: str, site: str) -> None:
        self.syncs.append((seconds, kind, site))

    def on_copy(self, pinned: bool, non_blocking: bool) -> None:
        self.copies.append((pinned, non_blocking))

    def on_optimizer(self, optimizer: Any, starting: bool) -> None:
        self.steps += int(not starting)

    def __getattr__(self, name: str) -> Any:  # the other listener callbacks
        return lambda *args: None


class OnGpu(torch.Tensor):
    """A CPU tensor that says it lives on a GPU: the wrappers treat it as one, the math runs on the CPU."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def _planted_syncs(t: Any) -> None:
    if t.sum() > 0:  # bool(t): HF Trainer's NaN/Inf filter syncs this way   # line: bool
        pass
    float(t.sum())
    int(t[0])
    t.nonzero()
    t.item() if t.numel() == 1 else t[0].item()
    warnings.warn(SYNC_WARNING, stacklevel=1)  # what torch raises as t[mask] or masked_select returns


def test_host_syncs_through_c_methods_are_counted_at_their_call_sites(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    modes: list[int] = []
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: modes.append(mode))
    original_bool = torch.Tensor.__bool__
    listener = _Recorder()
    hooks = Hooks(listener)  # type: ignore[arg-type]
    hooks.install()
    hooks.install_sync_watch()
    try:
        t = torch.tensor([1.0, 0.0, 2.0]).as_subclass(OnGpu)
        with warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("default")
            hooks._install_sync_detector(torch)  # record=True replaced showwarning: hook in again
            _planted_syncs(t)
        kinds = [k for _, k, _ in listener.syncs]
        assert kinds == ["bool", "float", "int", "nonzero", "item", "other"]
        assert all(
            site.startswith("test_gpu_paths.py:") and "_planted_syncs" in site
            for _, _, site in listener.syncs
        )
        assert all(s is not None and s >= 0 for s, k, _ in listener.syncs if k != "other")
        assert listener.syncs[-1][0] is None  # detected by torch's sync debug mode: counted, not timed
        assert not [w for w in shown if SYNC_WARNING in str(w.message)]  # never shown to the user
        cpu = torch.tensor([1.0])
        bool(cpu), cpu.item()  # CPU tensors do not sync
        assert len(listener.syncs) == 6
    finally:
        hooks.remove()
    assert "warn" in modes and modes[-1] == 0  # torch's mode back to what the job had
    assert torch.Tensor.__bool__ is original_bool


def test_blocking_copies_to_the_gpu_are_syncs_even_from_pinned_memory() -> None:
    listener = _Recorder()
    hooks = Hooks(listener)  # type: ignore[arg-type]
    hooks.active = True
    to_gpu = hooks._timed_copy(lambda tensor, *a, **k: types.SimpleNamespace(device=torch.device("cuda", 0)))

    def host(pinned: bool) -> Any:
        return types.SimpleNamespace(device=torch.device("cpu"), is_pinned=lambda: pinned)

    to_gpu(host(True), "cuda")  # pin_memory=True, HF's default non_blocking=False
    to_gpu(host(False), "cuda")
    to_gpu(host(True), "cuda", non_blocking=True)
    assert listener.copies == [(True, False), (False, False), (True, True)]
    assert [k for _, k, _ in listener.syncs] == [
        "copy_to_device",
        "copy_to_device",
    ]  # the overlapped one is not


# -- item 9: CUDA-graph capture and compiled optimizer steps ----------------------------------------------
def _steps(n: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(n):
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()


def test_the_hooks_step_aside_while_a_cuda_graph_is_captured(monkeypatch: pytest.MonkeyPatch) -> None:
    listener = _Recorder()
    hooks = Hooks(listener)  # type: ignore[arg-type]
    hooks.install()
    try:
        _steps(2)
        assert listener.steps == 2
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        _steps(3)
        assert listener.steps == 2  # no timing event or clock read inside the capture
    finally:
        hooks.remove()


# -- item 4: the FlashAttention packing batch in a plain loop ---------------------------------------------
def test_flash_packing_batch_moves_through_a_plain_loop() -> None:
    from pitstop.data.collate import PackingCollator

    batch = PackingCollator("flash_attention_2")([{"input_ids": [1, 2, 3, 4, 5], "seq_lens": [2, 3]}])
    moved = {k: v.to("cpu") for k, v in batch.items()}  # raised AttributeError on the int maxima before
    moved = {k: v.cuda() if False else v.pin_memory() if False else v for k, v in moved.items()}
    assert type(moved["max_length_q"]).__mro__[1] is int and moved["max_length_q"] == 3
    assert isinstance(moved["max_length_k"], int) and not isinstance(moved["max_length_k"], torch.Tensor)
    again = pickle.loads(pickle.dumps(moved))  # DataLoader workers send batches pickled
    assert again["max_length_q"].to("cpu") == 3 and again["cu_seq_lens_q"].tolist() == [0, 2, 5]


# -- item 9: the attention term's context length ------------------------------------------------------------
def test_attention_context_is_the_token_weighted_length() -> None:
    lengths = [100, 100, 100, 1700]  # one long example among short ones
    assert attention_context(lengths) == pytest.approx(
        (3 * 100**2 + 1700**2) / 2000
    )  # 1460, not the mean 500
    assert attention_context([]) is None


# -- issue 14 item 8: a Hugging Face model in a plain loop -----------------------------------------------
def test_a_hugging_face_model_inside_the_users_module_is_recognised() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    cfg._attn_implementation = "sdpa"

    class Mine(torch.nn.Module):  # the user's wrapper: no .module, no .config
        def __init__(self) -> None:
            super().__init__()
            self.lm = transformers.LlamaForCausalLM(cfg)

        def forward(self, ids: Any) -> Any:
            return self.lm(input_ids=ids, labels=ids).loss

    torch.manual_seed(0)
    model = Mine()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    probe = Probe(ProbeConfig(warmup=1, steps=2, announce=False)).install()
    try:
        for _ in range(4):
            model(torch.randint(0, 64, (2, 8))).backward()
            opt.step()
            opt.zero_grad()
    finally:
        probe.hooks.remove()
    env = probe.environment
    assert env is not None and env.model.model_type == "llama" and env.model.library == "transformers"
    assert env.model.n_layers == 2 and env.attention.implementation == "sdpa"


def test_weak_proxies_to_modules_never_stop_the_model_search() -> None:
    """A ``weakref.proxy`` forwards ``isinstance`` to its referent: a dead one raised ReferenceError
    inside the probe (seen in CI, where another test's proxy outlived its module)."""
    import weakref

    from pitstop.probe.environment import _all_modules, find_model

    gone = torch.nn.Linear(2, 2)
    dead = weakref.proxy(gone)
    del gone
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    alive = weakref.proxy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    modules = list(_all_modules())
    assert all(type(m) is not type(alive) for m in modules)  # proxies are not modules
    assert find_model(opt) is model
    assert dead is not None and alive is not None  # both proxies lived through the search


def test_the_probe_counts_the_square_lengths_the_attention_term_needs() -> None:
    from pitstop.core.profile import RankProfile, RunProfile, StepRecord
    from pitstop.diagnose.metrics import context_length
    from pitstop.probe.batch import count_batch

    packed = count_batch(
        {"input_ids": torch.ones(1, 5, dtype=torch.long), "position_ids": torch.tensor([[0, 1, 0, 1, 2]])}
    )
    assert packed.attended == 2**2 + 3**2
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    padded = count_batch({"input_ids": torch.ones(2, 4, dtype=torch.long), "attention_mask": mask})
    assert padded.attended == 3**2 + 1**2 and padded.real_tokens == 4
    step = StepRecord(index=1, wall_s=1.0, real_tokens=2000, examples=4, attended=3 * 100**2 + 1700**2)
    profile = RunProfile(source="watch", ranks=[RankProfile(steps=[step])])
    assert context_length(profile) == pytest.approx(1460.0)  # E[L²]/E[L]; the mean length would be 500


def test_an_optimizer_over_offloaded_copies_still_finds_the_model() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)).to("meta")  # off the CPU
    masters = [torch.zeros(p.shape, requires_grad=True) for p in model.parameters()]  # CPU fp32 copies
    opt = torch.optim.AdamW(masters, lr=1e-3)
    assert envmod.find_model(opt) is model
    assert envmod.model_info(model, opt).params_total == 8 * 8 + 8 + 8 * 2 + 2


def test_the_sync_detector_stays_in_front_of_a_handler_installed_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    listener = _Recorder()
    hooks = Hooks(listener)  # type: ignore[arg-type]
    with warnings.catch_warnings():
        hooks.install()
        hooks._install_sync_detector(torch)
        logged: list[str] = []
        warnings.showwarning = lambda message, *rest: logged.append(str(message))  # logging.captureWarnings
        try:
            _steps(1)  # the detector puts itself back in front at the step
            warnings.warn(SYNC_WARNING, stacklevel=1)
            warnings.warn("something else", UserWarning, stacklevel=1)
        finally:
            hooks.remove()
    assert [k for _, k, _ in listener.syncs] == ["other"]
    assert logged == ["something else"]  # the job's handler still sees its own warnings, not ours
