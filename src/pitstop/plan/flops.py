"""FLOPs per token, MFU and expected throughput.

The model (PaLM, Chowdhery et al. 2022, appendix B), per trained token, forward + backward:

    flops_per_token = 6 · N_matmul + 12 · n_layers · d_attn · T

* ``N_matmul``: parameters that take part in a matrix multiply for every token: all parameters except the
  input embedding table (the output projection counts; with tied embeddings it is the same tensor, counted
  once, as a matmul). For a mixture of experts only the experts a token is routed to count: the
  ``(E - k) / E`` share of the expert weights a token skips (``ModelInfo.params_inactive``) is left out.
* ``12 · n_layers · d_attn · T``: the attention scores (QKᵀ) and the weighted sum (AV), 2 matmuls × 2 FLOPs
  per multiply-add × 3 for forward + backward, with ``d_attn = n_heads · head_dim`` and ``T`` the context
  length the *average token* sees. For examples of varying length L (packed or variable-length data) a
  token of an example of length L works over L positions, so the token-weighted mean is
  ``T = E[L²] / E[L]`` (``attention_context``), not the mean example length E[L].
* Convention: the full T × T work is counted, causal masking not credited (PaLM's and Megatron's MFU
  convention). That is what eager attention and SDPA's math kernel do. FlashAttention-2 and SDPA's flash /
  memory-efficient kernels skip the masked upper tiles and do about half of it: their MFU by this count
  is up to the attention share higher than the FLOPs they actually executed.
* When the base weights are frozen (LoRA and friends) there is no weight gradient for them: 4 FLOPs per
  frozen parameter per token instead of 6, and 6 for the trainable ones.

MFU = achieved model FLOP/s ÷ (number of accelerators × dense peak FLOP/s for the compute dtype).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pitstop.core.profile import ModelInfo
from pitstop.hardware import GpuSpec


@dataclass(frozen=True)
class FlopsPerToken:
    dense: float
    attention: float
    basis: str

    @property
    def total(self) -> float:
        return self.dense + self.attention


def matmul_params(model: ModelInfo) -> int | None:
    """Parameters multiplied per token: everything except the input embedding table (see module doc)."""
    if model.params_total is None:
        return None
    embedding = model.params_embedding or 0
    n = model.params_total - embedding - (model.params_inactive or 0)
    if model.tied_embeddings and embedding:
        n += embedding  # the tied table is still used once per token, as the output projection
    return max(n, 0)


def attention_context(lengths: Sequence[float]) -> float | None:
    """The context length T of the attention term for examples of these lengths: E[L²] / E[L]."""
    total = float(sum(lengths))
    return float(sum(n * n for n in lengths)) / total if total > 0 else None


def flops_per_token(model: ModelInfo, context_len: float | None) -> FlopsPerToken | None:
    """Training FLOPs per token; None when the parameter count is unknown."""
    n = matmul_params(model)
    if n is None:
        return None
    trainable = model.params_trainable if model.params_trainable is not None else model.params_total
    frozen = max(n - min(trainable or 0, n), 0)
    dense = 6.0 * (n - frozen) + 4.0 * frozen
    attention = 0.0
    d_attn = None
    if model.n_heads and model.head_dim:
        d_attn = model.n_heads * model.head_dim
    elif model.hidden_size:
        d_attn = model.hidden_size
    if model.n_layers and d_attn and context_len:
        attention = 12.0 * model.n_layers * d_attn * context_len
    basis = "6·N_matmul + 12·L·d_attn·T (PaLM appendix B)"
    if model.params_inactive:
        basis += f"; {model.experts_active} of {model.n_experts} experts active per token"
    if frozen:
        basis += "; frozen weights at 4·N (no weight gradient)"
    return FlopsPerToken(dense=dense, attention=attention, basis=basis)


def mfu(tokens_per_s: float, fpt: FlopsPerToken, gpu: GpuSpec, dtype: str, n_gpus: int) -> float | None:
    """Model-FLOPs utilization of ``n_gpus`` accelerators for the given compute dtype."""
    peak = gpu.peak_flops(dtype)
    if peak is None or n_gpus <= 0:
        return None
    return tokens_per_s * fpt.total / (peak * n_gpus)


def expected_tokens_per_s(
    fpt: FlopsPerToken, gpu: GpuSpec, dtype: str, n_gpus: int, mfu_range: tuple[float, float]
) -> tuple[float, float] | None:
    """Tokens/s this hardware should reach for this model in an MFU range (``plan/rate.py`` gives it)."""
    peak = gpu.peak_flops(dtype)
    if peak is None:
        return None
    return tuple(m * peak * n_gpus / fpt.total for m in mfu_range)  # type: ignore[return-value]
