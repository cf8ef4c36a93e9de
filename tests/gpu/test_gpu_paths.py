"""Issue 19 items 1-8 on a real GPU: what the CPU tests check against API shapes, confirmed on the device."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from tests.gpu.conftest import observe, tiny_llama

torch = pytest.importorskip("torch")


def _batch(device: Any, rows: int = 4, seq: int = 64, vocab: int = 256) -> dict[str, Any]:
    ids = torch.randint(1, vocab, (rows, seq), device=device)
    return {"input_ids": ids, "labels": ids}


# -- item 1 -------------------------------------------------------------------------------------------
def test_1_offloaded_optimizer_run_is_a_gpu_run(figure: Any) -> None:
    """The model computes on the GPU, the optimizer steps fp32 copies on the CPU (ZeRO-Offload's shape)."""
    model = tiny_llama("cuda")
    masters = [p.detach().float().cpu().requires_grad_(True) for p in model.parameters()]
    opt = torch.optim.AdamW(masters, lr=1e-4)

    def train() -> None:
        for _ in range(10):
            loss = model(**_batch("cuda")).loss
            loss.backward()
            for master, p in zip(masters, model.parameters(), strict=True):
                master.grad = p.grad.detach().float().cpu()
                p.grad = None
            opt.step()
            with torch.no_grad():
                for master, p in zip(masters, model.parameters(), strict=True):
                    p.copy_(master.to("cuda", non_blocking=True))

    rank = observe(train)
    env = rank.environment
    figure("device", env.device)
    figure("offload", env.offload)
    figure("forward_ms", round(1000 * (rank.steps[-1].forward_s or 0), 3))
    figure("gpus_held", env.gpus_held)
    assert env.device == "cuda" and env.gpu_name
    assert env.gpus_held == 1  # the model on one GPU; its CPU optimizer partitions hold none
    assert env.offload.get("optimizer") == "cpu"
    assert all(s.forward_s is not None and s.forward_s > 0 for s in rank.steps)  # CUDA event timing ran


# -- item 2 -------------------------------------------------------------------------------------------
def test_2_moe_flops_count_active_experts_and_the_device_is_matched(figure: Any) -> None:
    from pitstop.hardware import lookup_gpu
    from pitstop.plan.flops import flops_per_token
    from pitstop.plan.params import count_params

    moe = dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2)
    model = tiny_llama("cuda", **moe)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train() -> None:
        for _ in range(40):
            model(**_batch("cuda")).loss.backward()
            opt.step()
            opt.zero_grad()

    rank = observe(train, warmup=2, steps=30)
    info = rank.environment.model
    planned = count_params(model.config.to_dict())
    fpt = flops_per_token(info, 64.0)
    figure("experts", f"{info.experts_active} of {info.n_experts}")
    figure("inactive_params", info.params_inactive)
    figure("gflop_per_token", round((fpt.total if fpt else 0) / 1e9, 6))
    assert info.n_experts == 4 and info.experts_active == 2
    assert info.params_inactive == planned.inactive > 0
    name = torch.cuda.get_device_name()
    spec = lookup_gpu(name)
    figure("gpu", f"{name} -> {spec.key if spec else 'unknown'}")
    if spec is not None and " MIG " in f" {name} ":
        assert (
            spec.mig is not None and spec.memory_bytes < 2 * torch.cuda.get_device_properties(0).total_memory
        )
    if importlib.util.find_spec("pynvml") is not None:
        samples = [s for s in rank.gpu_samples if s.mem_total]
        figure("nvml_samples", len(rank.gpu_samples))
        assert samples, f"NVML gave no samples: {rank.probe_errors}"
        if len(samples) > 2:  # item 9: the sampler's real rate, with both PCIe queries in every sample
            figure("nvml_hz", round((len(samples) - 1) / (samples[-1].t - samples[0].t), 2))
        if spec is not None and spec.mig:  # the slice's own memory, and no made-up utilization
            assert all(s.util is None for s in samples)


# -- item 3 -------------------------------------------------------------------------------------------
def test_3_every_planted_host_sync_is_counted_at_its_call_site(figure: Any) -> None:
    model = torch.nn.Linear(256, 256).to("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def train() -> None:
        for _ in range(8):
            host = torch.randn(64, 256, pin_memory=True)
            x = host.to("cuda")  # pinned but blocking: HF's default
            loss = model(x).pow(2).mean()
            if bool(torch.isfinite(loss)):  # HF Trainer's NaN/Inf filter
                pass
            float(loss)
            (x > 0).nonzero()
            _ = x[x > 0.5]  # boolean-mask indexing: caught by torch's sync debug mode
            loss.backward()
            opt.step()
            opt.zero_grad()

    rank = observe(train)
    kinds: dict[str, int] = {}
    for site in rank.sync_sites:
        kinds[site.kind] = kinds.get(site.kind, 0) + site.count
    steps = len(rank.steps)
    figure("syncs_per_step", round(sum(s.syncs or 0 for s in rank.steps) / steps, 2))
    figure("sync_ms_per_step", round(1000 * sum(s.sync_s or 0 for s in rank.steps) / steps, 3))
    figure("kinds", kinds)
    figure("top_site", rank.sync_sites[0].site if rank.sync_sites else None)
    for kind in ("copy_to_device", "bool", "float", "nonzero", "other"):
        assert kinds.get(kind, 0) >= steps, (kind, kinds)
    assert all(site.site.startswith("test_gpu_paths.py:") for site in rank.sync_sites)
    dl = rank.environment.dataloader
    assert dl.h2d_copies and dl.h2d_copies_pinned_blocking == dl.h2d_copies


# -- item 4 -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("attn", ["sdpa", "flash_attention_2"])
def test_4_packing_collator_batches_go_through_a_plain_loop(attn: str, figure: Any) -> None:
    from pitstop.data.collate import PackingCollator

    if attn.startswith("flash") and importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash_attn is not installed")
    model = tiny_llama("cuda", attn)
    collate = PackingCollator(attn, pad_token_id=0)
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(4):
        lens = [int(n) for n in torch.randint(8, 40, (3,), generator=g)]
        rows.append({"input_ids": torch.randint(1, 256, (sum(lens),), generator=g), "seq_lens": lens})
    batch = collate(rows)
    batch = {k: v.to("cuda") for k, v in batch.items()}  # the usual plain-loop move
    loss = model(**batch).loss
    loss.backward()
    figure("loss", round(float(loss), 4))
    assert torch.isfinite(loss)


# -- item 7 -------------------------------------------------------------------------------------------
def test_7_timing_and_memory_on_the_model_device_without_set_device(figure: Any) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    model = tiny_llama("cuda:1")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train() -> None:
        for _ in range(8):
            model(**_batch("cuda:1")).loss.backward()
            opt.step()
            opt.zero_grad()

    rank = observe(train)
    figure("forward_ms", round(1000 * (rank.steps[-1].forward_s or 0), 3))
    figure("peak_allocated_mib", (rank.memory.peak_allocated or 0) >> 20)
    assert torch.cuda.current_device() == 0
    assert all(s.forward_s and s.forward_s > 0 for s in rank.steps)
    assert rank.memory.peak_allocated and rank.memory.peak_allocated > 0  # GPU 1's, not idle GPU 0's


# -- item 8 -------------------------------------------------------------------------------------------
def test_8_planner_capacity_is_what_the_device_reports(figure: Any) -> None:
    from pitstop.hardware import lookup_gpu

    name = torch.cuda.get_device_name()
    spec = lookup_gpu(name)
    _free, total = torch.cuda.mem_get_info()
    figure("gpu", name)
    figure("measured_mib", total >> 20)
    figure("table_mib", spec.memory_mib if spec else None)
    if spec is None:
        pytest.skip(f"{name} is not in the hardware table")
    assert spec.memory_bytes == pytest.approx(total, rel=0.03)
