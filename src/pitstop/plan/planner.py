"""``pitstop plan``: does it fit, which micro-batch, is offload needed, how fast should it be.

Everything here is arithmetic on the memory model (``plan.memory``), the FLOPs model (``plan.flops``) and
the hardware table; the optional fake-tensor simulation (``plan.simulate``) is shown beside the analytic
activation figure as its cross-check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from pitstop import schemas
from pitstop.core.profile import ModelInfo
from pitstop.core.vocabulary import Sharding
from pitstop.errors import PitstopError
from pitstop.hardware import EXPECTED_MFU, GpuSpec, derated
from pitstop.interconnect import Link
from pitstop.plan.comm import communication
from pitstop.plan.flops import FlopsPerToken, flops_per_token
from pitstop.plan.memory import (
    AC_MODES,
    GIB,
    OPTIMIZERS,
    PAGED,
    PRECISIONS,
    Memory,
    Setup,
    held_after_forward,
    memory,
)
from pitstop.plan.params import ParamCounts
from pitstop.plan.rate import MfuBand, expected_mfu

MID_MFU = sum(EXPECTED_MFU) / 2
PCIE_EFFICIENCY = 0.8
CPU_ADAM_PARAMS_PER_S = 2.0e9  # DeepSpeed's CPU Adam (AVX-512, one socket): taken as 2e9 parameters a second

# step-time cost of each memory-saving change, relative to the plan as asked (basis in the text)
SLOWDOWN = {
    "chunked_loss": (
        1.01,
        "fused / chunked cross-entropy: the same math, the logits never materialized in fp32",
    ),
    "adamw8bit": (1.02, "8-bit AdamW (bitsandbytes): optimizer step a little slower; states 4× smaller"),
    "checkpointing": (1.33, "activation checkpointing recomputes the forward pass: ~4/3 of the step's FLOPs"),
    "lora": (
        0.75,
        "LoRA trains adapters only: no weight gradients for the base (4 instead of 6 FLOPs/param); "
        "it changes what is trained",
    ),
    "qlora": (0.95, "QLoRA: LoRA's savings, minus dequantizing the 4-bit base on every use"),
}


@dataclass
class Alternative:
    change: str
    memory_gib: float
    fits: bool
    est_slowdown: float
    basis: str


@dataclass
class Plan:
    name: str
    gpu: GpuSpec
    setup: Setup
    params: ParamCounts
    mem: Memory
    fits: bool
    needs_offload: bool
    max_micro_batch: int
    gradient_accumulation: int | None
    alternatives: list[Alternative]
    fpt: FlopsPerToken
    notes: list[str] = field(default_factory=list)
    offload: dict[str, float] | None = None
    simulated_activations: float | None = None
    comm: dict[str, Any] | None = None  # plan.comm.communication: collectives per step, time, options
    max_seq: int | None = None  # --seq auto: the longest sequence that fits at this micro-batch
    compile: bool = False  # torch.compile: a higher expected MFU (plan/rate.py)
    power_limit_w: float | None = None  # a GPU capped below its board power: its peak derated

    @property
    def gpu_bytes(self) -> float:
        return float(self.gpu.memory_bytes)

    @property
    def peak_gpu(self) -> GpuSpec:
        """The GPU at its sustained clocks: derated under ``power_limit_w`` (``hardware.derated``)."""
        return derated(self.gpu, self.power_limit_w)

    @property
    def tokens_per_s_at_100pct(self) -> float:
        gpu = self.peak_gpu
        peak = gpu.peak_flops("bf16") or gpu.peak_flops("fp16") or gpu.peak_flops("fp32") or 0.0
        return peak * self.setup.gpus / self.fpt.total

    @property
    def rate(self) -> MfuBand:
        """The MFU this GPU should reach for this setup (``plan/rate.py``), with its basis."""
        return self._rate(self.setup.offload)

    def _rate(self, offload: str) -> MfuBand:
        s = self.setup
        ac = s.ac_mode
        return expected_mfu(
            self.peak_gpu,
            method=s.method,
            compile=self.compile,
            ac=ac,
            ac_every=s.ac_every,
            ac_offload=s.ac_offload,
            offload=offload,
            fpt=self.fpt,
            model=s.model,
            tokens_per_micro_batch=float(s.micro_batch * s.seq),
            offload_slowdown=(self.offload or {}).get("est_slowdown"),
        )

    @property
    def expected_tokens_per_s(self) -> tuple[float, float]:
        rate = self.rate
        return rate.low * self.tokens_per_s_at_100pct, rate.high * self.tokens_per_s_at_100pct

    def to_dict(self) -> dict[str, Any]:
        low, high = self.expected_tokens_per_s
        rate = self.rate
        doc: dict[str, Any] = {
            "schema": schemas.PLAN,
            "model": self.name,
            "gpu": self.gpu.key,
            "gpus": self.setup.gpus,
            "setup": {
                k: v
                for k, v in vars(self.setup).items()
                if k
                in (
                    "seq",
                    "micro_batch",
                    "zero",
                    "offload",
                    "method",
                    "optimizer",
                    "attn",
                    "checkpointing",
                    "chunked_loss",
                    "lora_rank",
                    "sharding",
                    "nodes",
                    "hpz",
                    "precision",
                    "ac",
                    "ac_every",
                    "ac_offload",
                    "optimizer_in_backward",
                )
            },
            "params": {
                "total": self.params.total,
                "non_embedding": self.params.non_embedding,
                "trainable": self.params.trainable,
                "exact": self.params.exact,
            },
            "memory_gib": self.mem.gib(),
            "cpu_memory_gib": round(self.mem.cpu / GIB, 2),
            "gpu_memory_gib": round(self.gpu.memory_gib, 2),
            "fits": self.fits,
            "needs_offload": self.needs_offload,
            "max_micro_batch": self.max_micro_batch,
            "gradient_accumulation": self.gradient_accumulation,
            "alternatives": [vars(a) for a in self.alternatives],
            "flops_per_token": self.fpt.total,
            "flops_basis": self.fpt.basis,
            "tokens_per_s_at_100pct_mfu": round(self.tokens_per_s_at_100pct, 1),
            "tokens_per_s_expected": [round(low, 1), round(high, 1)],
            "expected_mfu": [rate.low, rate.high],
            "expected_basis": rate.basis,
            "compile": self.compile,
            "power_limit_w": self.power_limit_w,
            "notes": self.notes,
        }
        if self.offload is not None:
            doc["offload_cost"] = self.offload
        if self.comm is not None:
            doc["communication"] = self.comm
        if self.max_seq is not None:
            doc["max_seq"] = self.max_seq
        if self.simulated_activations is not None:
            doc["held_after_forward_gib"] = {
                "formula": round(held_after_forward(self.setup) / GIB, 3),
                "simulated": round(self.simulated_activations / GIB, 3),
            }
        return doc


class PlanError(PitstopError, ValueError):
    """An impossible or unsupported combination, said in one line."""


def validate(s: Setup) -> None:
    if s.offload not in ("none", "optimizer", "param"):
        raise PlanError("--offload is none, optimizer or param")
    if s.offload != "none" and s.zero == 0:
        raise PlanError("offload needs DeepSpeed ZeRO (--zero 1, 2 or 3)")
    if s.offload == "param" and s.zero != 3:
        raise PlanError("offload_param needs ZeRO-3 (ZeRO-1/2 can offload only the optimizer)")
    if s.zero not in (0, 1, 2, 3):
        raise PlanError("--zero is 0, 1, 2 or 3")
    if s.method not in ("full", "lora", "qlora"):
        raise PlanError("--method is full, lora or qlora")
    if s.attn not in ("sdpa", "flash", "eager"):
        raise PlanError("--attn is sdpa, flash or eager")
    _validate_states(s)
    if s.seq < 1 or s.micro_batch < 1 or s.gpus < 1:
        raise PlanError("sequence length, micro-batch and GPUs must be at least 1")
    _validate_layout(s)


def _validate_states(s: Setup) -> None:
    """Precision, checkpointing and optimizer choices that exist together (``plan.memory``'s module doc)."""
    if s.precision not in PRECISIONS:
        raise PlanError(f"--precision is {' or '.join(PRECISIONS)}")
    if s.ac not in AC_MODES:
        raise PlanError(f"--ac is {', '.join(AC_MODES)}")
    if s.checkpointing and s.ac not in ("none", "full"):
        raise PlanError("--checkpointing means --ac full: give one of them")
    if s.ac_every < 0 or (s.ac_every and s.ac_mode != "selective"):
        raise PlanError("--ac-every N is selective checkpointing's per-N-layers form: with --ac selective")
    if s.optimizer not in OPTIMIZERS:
        raise PlanError(f"--optimizer is one of {', '.join(OPTIMIZERS)}")
    if s.offload != "none" and (s.optimizer in PAGED or s.optimizer_in_backward):
        raise PlanError("DeepSpeed offload runs its own CPU optimizer: not with a paged or in-backward one")


def _validate_layout(s: Setup) -> None:
    """GPUs over nodes, the FSDP strategy and ZeRO++ hpZ must describe a job that can exist."""
    if s.nodes < 1 or s.gpus % s.nodes:
        raise PlanError(f"{s.gpus} GPUs do not split evenly over {s.nodes} nodes")
    if s.sharding is not None and s.sharding not in {str(v) for v in Sharding}:
        raise PlanError(f"--sharding is one of {', '.join(str(v) for v in Sharding)}")
    if s.sharding is not None and s.offload == "optimizer":
        raise PlanError("FSDP offloads parameters and optimizer together: --offload param with --sharding")
    if s.hpz > 1 and (s.zero != 3 or s.sharding is not None):
        raise PlanError("--hpz (ZeRO++ zero_hpz_partition_size) needs DeepSpeed ZeRO-3 (--zero 3)")
    if s.hpz > 1 and s.gpus % s.hpz:
        raise PlanError(f"--hpz {s.hpz} does not divide {s.gpus} GPUs")


def model_info(params: ParamCounts, shape: ModelInfo) -> ModelInfo:
    """The planned model: its shape (from its config) with the parameters counted for the training method."""
    return replace(
        shape,
        params_total=params.total,
        params_trainable=params.trainable,
        params_embedding=params.embedding,
        params_inactive=params.inactive if shape.n_experts else None,
    )


def longest_sequence(s: Setup, gpu_bytes: float, most: int) -> int:
    """The longest sequence (tokens per row) whose memory fits at this micro-batch, up to ``most`` (0 when
    not even one token's does): memory grows with the sequence, so a gallop and a bisection find it."""

    def fits(n: int) -> bool:
        return memory(replace(s, seq=n), gpu_bytes).total <= gpu_bytes

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= most and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, most + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def largest_micro_batch(s: Setup, gpu_bytes: float) -> int:
    """The largest micro-batch whose memory fits (0 when even one sequence does not)."""

    def fits(b: int) -> bool:
        return memory(replace(s, micro_batch=b), gpu_bytes).total <= gpu_bytes

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi) and hi < 1 << 16:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def offload_cost(
    s: Setup,
    params: ParamCounts,
    gpu: GpuSpec,
    fpt: FlopsPerToken,
    accumulation: int = 1,
    mfu: float = MID_MFU,
) -> dict[str, float]:
    """PCIe bytes per optimizer step for an offload configuration, the time they take, and the slow-down of
    the optimizer step's compute (``accumulation`` micro-batches of it) by them."""
    n = max(s.gpus, 1)
    trained = params.trainable / n
    moved = 4.0 * trained  # bf16 gradients down, bf16 updated weights up
    if s.offload == "param":  # weights fetched for every forward and again for every backward
        moved += 2.0 * params.total / n * 2 * accumulation
    link = gpu.pcie_gbps * 1e9 * PCIE_EFFICIENCY
    pcie_s = moved / link
    cpu_adam_s = trained / CPU_ADAM_PARAMS_PER_S
    tokens = s.micro_batch * s.seq * accumulation
    peak = gpu.peak_flops("bf16") or gpu.peak_flops("fp32") or 1.0
    compute_s = tokens * fpt.total / (peak * mfu)
    return {
        "pcie_gb_per_step": round(moved / 1e9, 3),
        "pcie_s_per_step": round(pcie_s, 4),
        "cpu_optimizer_s_per_step": round(cpu_adam_s, 4),
        "compute_s_per_step": round(compute_s, 4),
        "est_slowdown": round((compute_s + pcie_s + cpu_adam_s) / compute_s, 2),
    }


def alternatives(
    s: Setup, params: ParamCounts, gpu: GpuSpec, fpt: FlopsPerToken, accumulation: int = 1
) -> list[Alternative]:
    gpu_bytes = float(gpu.memory_bytes)
    options: list[tuple[str, Setup, float, str]] = []
    if not s.chunked_loss:
        options.append(
            ("fused / chunked cross-entropy", replace(s, chunked_loss=True), *SLOWDOWN["chunked_loss"])
        )
    if s.optimizer in ("adamw", "adamw_fused") and s.method == "full":
        options.append(("8-bit AdamW", replace(s, optimizer="adamw8bit"), *SLOWDOWN["adamw8bit"]))
    if s.ac_mode != "full":
        options.append(
            (
                "activation checkpointing",
                replace(s, checkpointing=True, ac="none", ac_every=0),
                *SLOWDOWN["checkpointing"],
            )
        )
    if s.method == "full":
        options.append(
            (f"LoRA r={s.lora_rank} on all linear layers", replace(s, method="lora"), *SLOWDOWN["lora"])
        )
        options.append(("QLoRA (4-bit base)", replace(s, method="qlora"), *SLOWDOWN["qlora"]))
    if s.zero < 3 and s.gpus > 1:
        options.append(
            (
                f"ZeRO-3 across the {s.gpus} GPUs",
                replace(s, zero=3, offload="none"),
                1.08,
                "gathering weights per layer costs ~8% with overlap on NVLink",
            )
        )
    for zero, offload, label in (
        (max(s.zero, 2), "optimizer", "offload the optimizer to CPU (ZeRO-Offload)"),
        (3, "param", "offload parameters and optimizer to CPU (ZeRO-Infinity)"),
    ):
        if (s.zero, s.offload) == (zero, offload):
            continue
        changed = replace(s, zero=zero, offload=offload)
        cost = offload_cost(changed, params, gpu, fpt)
        options.append(
            (
                label,
                changed,
                cost["est_slowdown"],
                f"{cost['pcie_gb_per_step']} GB over PCIe per micro-batch at 80% of "
                f"{gpu.pcie_gbps:.0f} GB/s, plus the optimizer on the CPU",
            )
        )
    out = []
    for label, changed, slowdown, basis in options:
        total = memory(changed, gpu_bytes).total
        out.append(Alternative(label, round(total / GIB, 2), total <= gpu_bytes, slowdown, basis))
    return sorted(out, key=lambda a: (not a.fits, a.est_slowdown))


def make_plan(
    name: str,
    gpu: GpuSpec,
    s: Setup,
    params: ParamCounts,
    global_batch: int | None = None,
    auto_micro_batch: bool = False,
    network: Link | None = None,
    *,
    compile: bool = False,
    power_limit_w: float | None = None,
) -> Plan:
    validate(s)
    gpu_bytes = float(gpu.memory_bytes)
    fpt = flops_per_token(s.model, float(s.seq))
    if fpt is None:  # pragma: no cover - counts are always known here
        raise PlanError("cannot compute FLOPs without parameter counts")
    best = largest_micro_batch(s, gpu_bytes)
    per_gpu = None
    if global_batch:
        if global_batch % s.gpus:
            raise PlanError(f"a global batch of {global_batch} does not split evenly over {s.gpus} GPUs")
        per_gpu = global_batch // s.gpus
    if auto_micro_batch and best:
        # the largest micro-batch that fits and divides the per-GPU batch, so accumulation reaches it exactly
        micro = (
            best if per_gpu is None else max(d for d in range(1, min(best, per_gpu) + 1) if per_gpu % d == 0)
        )
        s = replace(s, micro_batch=micro)
    mem = memory(s, gpu_bytes)
    fits = mem.total <= gpu_bytes
    no_offload = replace(s, offload="none")
    needs_offload = not fits and s.offload == "none"  # with offload given, it is not "needed" again
    accumulation = None
    if per_gpu is not None:
        accumulation = max(1, math.ceil(per_gpu / max(s.micro_batch, 1)))
    plan = Plan(
        name=name,
        gpu=gpu,
        setup=s,
        params=params,
        mem=mem,
        fits=fits,
        needs_offload=needs_offload,
        max_micro_batch=best,
        gradient_accumulation=accumulation,
        alternatives=alternatives(s, params, gpu, fpt),
        fpt=fpt,
        compile=compile,
        power_limit_w=power_limit_w,
    )
    if s.offload != "none":
        plan.offload = offload_cost(s, params, plan.peak_gpu, fpt, mfu=plan._rate("none").mid)
    plan.comm = communication(
        s, plan.peak_gpu, fpt.total, network, accumulation or 1, mfu=plan._rate("none").mid
    )
    if s.offload != "none" and memory(no_offload, gpu_bytes).total <= gpu_bytes:
        plan.notes.append("it fits without offload: offload only costs speed here")
    if not params.exact:
        plan.notes.append(
            "parameter counts from the analytic formula (transformers does not build this model type)"
        )
    if s.zero >= 1 and s.gpus == 1:
        plan.notes.append("ZeRO on one GPU partitions nothing; it only matters with offload")
    return plan
