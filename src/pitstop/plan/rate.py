"""The MFU a training run should reach on a GPU: a range per GPU generation and setup, with its basis.

pitstop's MFU counts *model* FLOPs (``plan/flops.py``: 6·N, 4·N for frozen weights, attention at the full
T × T) against the dense peak of the GPU as given (datasheet, or ``hardware.derated`` under a power cap).
Recomputation is never counted: it is not HFU. So full activation checkpointing, which does the forward
twice, lowers the expected MFU.

The model is a roofline of one token's time, from what the hardware does:

    t = F_dense / (peak · e_matmul) + F_attention / (peak · e_attention) + β · n_layers · d_model / bandwidth

* ``e_matmul``, ``e_attention``: the share of peak that the matmuls and the FlashAttention kernels reach in
  real training (GEMM shapes, kernel launch gaps, collectives not hidden), per generation (``EFFICIENCY``).
* ``β`` (``ELEMENTWISE_BYTES``): bytes of memory-bound traffic per layer per unit of width per token, forward
  and backward: norms, activations, residual adds, dropout, RoPE, casts. It is why a narrow model or a GPU
  with much compute per byte of bandwidth (H100: 295 FLOP/B, A100-80GB: 153) sits further from its peak.
  torch.compile fuses those chains into few kernels: a third of the traffic (``COMPILE_TRAFFIC``).
* LoRA adds the adapter path's traffic; QLoRA also dequantizes every 4-bit weight on every use; full
  checkpointing recomputes the forward (``AC_FULL``); offload adds what ``planner.offload_cost`` says.

The constants are fitted once, on the physics' free parameters only, to 211 published llm-foundry runs on
A100 40/80GB and H100 SXM (``docs/plan.md``, "Expected tokens/s"); generations with no published run borrow
the nearest fitted one and say so, with a wider range.
"""

from __future__ import annotations

from dataclasses import dataclass

from pitstop.core.profile import ModelInfo
from pitstop.hardware import GpuSpec
from pitstop.plan.flops import FlopsPerToken, matmul_params


@dataclass(frozen=True)
class MfuBand:
    """The expected MFU range and one clause naming what it was fitted on."""

    low: float
    high: float
    basis: str

    @property
    def mid(self) -> float:
        return (self.low + self.high) / 2

    def tokens_per_s(self, peak_flops: float, n_gpus: int, flops_per_token: float) -> tuple[float, float]:
        """The range in tokens/s for ``n_gpus`` GPUs of this peak and a model of these FLOPs per token."""
        scale = peak_flops * n_gpus / flops_per_token
        return self.low * scale, self.high * scale


@dataclass(frozen=True)
class Efficiency:
    """How close one generation's kernels get to its peak in real training, and what says so."""

    label: str
    matmul: float
    attention: float
    spread: float  # the range is the prediction ×(1 ± spread)
    basis: str


_FITTED = 0.15  # ±15%: two standard deviations of the fit's error (7.5% rms in log terms)
_ASSUMED = 0.25

EFFICIENCY: dict[str, Efficiency] = {
    "ampere": Efficiency(
        "Ampere", 0.66, 0.54, _FITTED, "fitted on 141 published llm-foundry runs on A100 40/80GB"
    ),
    "hopper": Efficiency(
        "Hopper", 0.54, 0.30, _FITTED, "fitted on 70 published llm-foundry runs on H100 SXM"
    ),
    "ada": Efficiency(
        "Ada", 0.66, 0.54, _ASSUMED, "Ampere's fit assumed (no published Ada run in the table)"
    ),
    "blackwell": Efficiency(
        "Blackwell", 0.54, 0.30, _ASSUMED, "Hopper's fit assumed (no published Blackwell run in the table)"
    ),
    "volta": Efficiency(
        "Volta", 0.60, 0.30, _ASSUMED, "assumed: no FlashAttention-2 before Ampere (no published run)"
    ),
    "turing": Efficiency(
        "Turing", 0.60, 0.30, _ASSUMED, "assumed: no FlashAttention-2 before Ampere (no published run)"
    ),
    "cdna2": Efficiency(
        "CDNA2", 0.45, 0.25, _ASSUMED, "assumed: ROCm GEMMs reach about half the peak (no published run)"
    ),
    "cdna3": Efficiency(
        "CDNA3", 0.45, 0.25, _ASSUMED, "assumed: ROCm GEMMs reach about half the peak (no published run)"
    ),
}
_UNKNOWN = Efficiency("unknown generation", 0.54, 0.30, _ASSUMED, "Hopper's fit assumed")

ELEMENTWISE_BYTES = 300.0
"""β: memory-bound bytes per layer, per unit of d_model, per token, forward + backward, in eager PyTorch
(about 150 bf16 reads and writes of the hidden state per layer). Fitted with the efficiencies above."""

COMPILE_TRAFFIC = 1 / 3
"""torch.compile (Inductor) fuses each pointwise chain between two matmuls into one kernel: taken as a third
of the eager traffic. Not fitted: no compiled run in the published table."""

LORA_BYTES = 126.0
"""LoRA's adapter path per layer, per unit of width, per token: 7 adapted projections each re-read their
input, write and read its dropout, and add the product, forward and twice backward (~63 bf16 values)."""

QLORA_DEQUANT_BYTES = 4.5
"""Bytes moved per frozen weight per use to dequantize NF4 to bf16: 0.5 read, 2 written, 2 read by the GEMM.
Used in the forward and in the backward's input gradient (and once more when checkpointing recomputes)."""

AC_FULL = 0.85
"""Full activation checkpointing: ×3/4 for the forward done twice at equal hardware efficiency, and ×1.13
because llm-foundry's 79 checkpointed runs kept their GPUs busier (HFU) than the same GPUs without it: the
larger micro-batches checkpointing allows, collectives hidden behind the extra compute."""

AC_SELECTIVE_TRAFFIC = 4 / 3
"""Selective (op-level) checkpointing keeps the matmul outputs and recomputes the pointwise ops: the forward's
share of the memory-bound traffic (a third) is done twice, no matmul is."""

AC_OFFLOAD_LOW = 0.85
"""Activation offloading copies each layer's activations to the host on a side stream, hidden behind compute
when PCIe keeps up (torchtune reports a few percent); the range's low end allows 15% for copies that do not."""

REFERENCE_TOKENS = 2048
"""Tokens per micro-batch assumed for QLoRA's per-micro-batch dequantization when the caller does not say."""


def generation_efficiency(gpu: GpuSpec) -> Efficiency:
    return EFFICIENCY.get(str(gpu.generation), _UNKNOWN) if gpu.generation else _UNKNOWN


def _peak(gpu: GpuSpec, dtype: str) -> float:
    for d in (dtype, "bf16", "fp16", "tf32", "fp32"):
        peak = gpu.peak_flops(d)
        if peak:
            return peak
    return 1.0


def expected_mfu(
    gpu: GpuSpec,
    *,
    method: str = "full",
    compile: bool = False,
    ac: str = "none",
    ac_every: int = 0,
    ac_offload: bool = False,
    offload: str = "none",
    fpt: FlopsPerToken | None = None,
    model: ModelInfo | None = None,
    tokens_per_micro_batch: float | None = None,
    offload_slowdown: float | None = None,
    dtype: str = "bf16",
) -> MfuBand:
    """The MFU range this GPU should reach for this setup, with the clause that says where it comes from.

    ``fpt`` and ``model`` (its ``n_layers``, ``hidden_size``) place the run on the roofline; without them the
    range is the matmul efficiency alone, widened down by the share memory-bound work usually takes.
    """
    eff = generation_efficiency(gpu)
    peak = _peak(gpu, dtype)
    bandwidth = gpu.mem_bw_tbs * 1e12
    traffic = ELEMENTWISE_BYTES * (COMPILE_TRAFFIC if compile else 1.0)
    if ac == "selective" and not ac_every:
        traffic *= AC_SELECTIVE_TRAFFIC
    if method in ("lora", "qlora"):
        traffic += LORA_BYTES
    words = [
        eff.label,
        "full training" if method == "full" else method.replace("qlora", "QLoRA").replace("lora", "LoRA"),
    ]
    if compile:
        words.append("torch.compile")
    layers = model.n_layers if model else None
    width = model.hidden_size if model else None
    shaped = fpt is not None and fpt.total > 0 and bool(layers) and bool(width)
    if shaped:
        assert fpt is not None and layers and width
        seconds = (
            fpt.dense / (peak * eff.matmul)
            + fpt.attention / (peak * eff.attention)
            + traffic * layers * width / bandwidth
        )
        if method == "qlora" and model is not None:
            frozen = (matmul_params(model) or 0) - (model.params_trainable or 0)
            uses = 3 if ac == "full" else 2
            tokens = tokens_per_micro_batch or REFERENCE_TOKENS
            seconds += max(frozen, 0) * QLORA_DEQUANT_BYTES * uses / tokens / bandwidth
        mid = fpt.total / (peak * seconds)
    else:
        mid = eff.matmul * 0.85  # memory-bound work: ~15% of a 7B-class step in the fit
        words.append("model shape unknown")
    low, high = mid * (1 - eff.spread), mid * (1 + eff.spread)
    if ac == "full":
        low, high = low * AC_FULL, high * AC_FULL
        words.append("full checkpointing (forward recomputed, not counted)")
    elif ac == "selective" and ac_every:
        share = 1 - (1 - AC_FULL) / ac_every
        low, high = low * share, high * share
        words.append(f"every {ac_every} layers checkpointed")
    elif ac == "selective":
        words.append("selective checkpointing (pointwise ops recomputed)")
    if ac_offload:
        low *= AC_OFFLOAD_LOW
        words.append("activations offloaded (the low end lowered for copies not hidden)")
    if offload != "none":
        if offload_slowdown and offload_slowdown > 1:
            low, high = low / offload_slowdown, high / offload_slowdown
            words.append(f"{offload} offload ×{offload_slowdown:.2f} slower")
        else:
            low *= 0.5
            words.append(f"{offload} offload (its cost unknown: the low end halved)")
    if gpu.power_limit_w is not None:
        words.append(f"capped at {gpu.power_limit_w:g} W")
    basis = f"{', '.join(words)}: {low:.0%}–{high:.0%} MFU ({eff.basis})"
    return MfuBand(round(low, 4), round(high, 4), basis)
