"""Offload to CPU / NVMe making each step wait on PCIe: the DeepSpeed / FSDP config's offload, worth the
bytes it moves per step, high when the model states would fit on the GPU without it."""

from __future__ import annotations

from pitstop.core.findings import Finding, use
from pitstop.core.profile import Environment
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, Severity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl
from pitstop.plan.from_run import setup_for_run
from pitstop.plan.memory import model_states
from pitstop.remedies import advise

GPU_MEMORY_USABLE = 0.6  # leave the rest for activations, workspace and fragmentation


def states_without_offload(env: Environment, gpus: int) -> float | None:
    """Bytes per GPU the weights, gradients and optimizer would take on the GPU: the planner's model
    (DeepSpeed's accounting), so `doctor` and `plan` agree on what fits."""
    setup = setup_for_run(env, gpus=gpus)
    return None if setup is None else sum(model_states(setup)[:3])


@cause(
    CauseId.OFFLOAD_BOUND,
    title="Offload makes each step wait on PCIe",
    because="optimizer or parameter offload to CPU/NVMe makes each step wait on PCIe",
    needs_gpu=True,
    needs=(Evidence.SETTINGS,),
    fires_when="optimizer or parameter offload in the DeepSpeed / FSDP config",
    estimate=(
        "PCIe bytes per step at 80% of the link, or the host optimizer time; high when the model states "
        "fit under {GPU_MEMORY_USABLE:.0%} of the GPU without offload"
    ),
    remedies=(RemedyId.NO_OFFLOAD,),
)
def offload_bound(ctx: RuleContext) -> Finding | None:
    offload = ctx.env.offload
    if not ctx.gpu_possible or not offload:
        return None
    m = ctx.metrics
    model = ctx.env.model
    n = model.params_total
    trainable = model.params_trainable if model.params_trainable is not None else n
    gpus = ctx.profile.world_size
    gpu_mem = ctx.env.gpu_memory_bytes or (ctx.gpu.memory_gib * 2**30 if ctx.gpu else None)
    evidence: dict[str, object] = {"offload": offload, "zero_stage": ctx.env.zero_stage, "world_size": gpus}
    fits = False
    need = states_without_offload(ctx.env, gpus)
    if need is not None and gpu_mem:
        fits = need <= GPU_MEMORY_USABLE * gpu_mem
        evidence["model_states_gib_per_gpu"] = round(need / 2**30, 2)
        evidence["gpu_memory_gib"] = round(gpu_mem / 2**30, 1)
    est = None
    basis = "offload time not estimable without the parameter count"
    if n and m.step_time_s:
        link = (ctx.gpu.pcie_gbps if ctx.gpu else 31.5) * 1e9 * 0.8
        per_rank = (trainable or n) / max(gpus, 1)
        moved = 0.0
        if "optimizer" in offload:
            moved += 4 * per_rank  # bf16 gradients down, bf16 updated weights up
        if "param" in offload:
            moved += 2 * n * 2 / max(gpus, 1)  # weights fetched for forward and again for backward
        pcie_s = moved / link
        evidence["pcie_gb_per_step_est"] = round(moved / 1e9, 3)
        evidence["pcie_s_per_step_est"] = round(pcie_s, 4)
        if m.pcie_rx_gbps is not None:
            evidence["pcie_rx_gbps_measured"] = round(m.pcie_rx_gbps, 2)
            evidence["pcie_tx_gbps_measured"] = round(m.pcie_tx_gbps or 0.0, 2)
        lost = max(pcie_s, (m.optimizer_frac or 0.0) * m.step_time_s)
        frac = min(lost / m.step_time_s, 0.95)
        est = amdahl(frac, float("inf")) if fits else None
        basis = (
            f"{moved / 1e9:.2f} GB over PCIe per step at 80% of the link, or the measured optimizer time on the "
            "host, whichever is larger"
            + ("" if fits else "; no estimate while the states do not fit the GPU")
        )
    where = " and ".join(f"{k}→{v}" for k, v in sorted(offload.items()))
    summary = f"Offload ({where}) makes every step move weights or gradients over PCIe"
    summary += (
        ", yet the model states fit in GPU memory without it."
        if fits
        else "; it may be needed to fit, but sharding or LoRA usually costs less."
    )
    if not ctx.measured:
        summary += " (From the config: run `pitstop plan` or `pitstop doctor` to size it.)"
    return Finding(
        cause=CauseId.OFFLOAD_BOUND,
        severity=Severity.HIGH if fits else Severity.MEDIUM,
        # config-only: the offload keys are read, the fit is the planner's (within ~2% of a simulated step)
        confidence=(0.8 if n else 0.5) if ctx.measured else (0.7 if fits else 0.6),
        summary=summary,
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=advise(
            ctx.framework, use(RemedyId.NO_OFFLOAD, offloaded=dict(offload), fits_without=fits, gpus=gpus)
        ),
    )
