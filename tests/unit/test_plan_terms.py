"""The memory terms issue 44 added, on small hand-computed cases (``plan.memory``'s module doc)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pitstop.core.profile import ModelInfo
from pitstop.plan.memory import (
    Setup,
    activation_bytes_per_token_layer,
    full_layer_bytes,
    held_activations,
    logits,
    model_states,
    offloaded_activations,
    selective_layer_bytes,
)
from pitstop.plan.model_shape import ModelConfigError, model_info_from_config

P = 1_000_000


def _setup(**kw: object) -> Setup:
    model = ModelInfo(model_type="llama", n_layers=2, hidden_size=64, n_heads=4, head_dim=16, n_kv_heads=4,
                      intermediate_size=256, vocab_size=100, params_total=P, params_embedding=0)  # fmt: skip
    return replace(Setup(model=model, seq=8, largest_module=1000), **kw)


def test_pure_bf16_adamw_is_8_bytes_per_parameter() -> None:
    weights, grads, opt, host = model_states(_setup(precision="bf16"))
    assert (weights, grads, opt, host) == (2 * P, 2 * P, 4 * P, 0.0)
    assert sum(model_states(_setup())[:3]) == 16 * P  # mixed stays 2 + 2 + 12


def test_paged_moments_leave_the_gpu_and_in_backward_holds_no_gradient_buffer() -> None:
    _weights, _grads, opt, host = model_states(_setup(optimizer="paged_adamw8bit", precision="bf16"))
    assert (opt, host) == (0.0, 2 * P)
    assert model_states(_setup(optimizer_in_backward=True, precision="bf16"))[1] == 2 * 1000


def test_non_gated_mlp_saves_half_the_gated_mlp() -> None:
    llama = _setup()
    mpt = replace(llama, model=replace(llama.model, model_type="mpt"))
    h, i = 64, 256
    # the MLP term halves (8i -> 4i); MPT's low-precision LayerNorms save 2h each instead of 6h
    assert full_layer_bytes(llama) - full_layer_bytes(mpt) == 4 * i + 2 * 4 * h
    assert selective_layer_bytes(llama) < full_layer_bytes(llama)


def test_mpt_config_keys_and_encoder_decoder_refused() -> None:
    shape = model_info_from_config({"model_type": "mpt", "d_model": 512, "n_layers": 4, "n_heads": 8,
                                    "expansion_ratio": 4, "vocab_size": 1000})  # fmt: skip
    assert (shape.hidden_size, shape.n_layers, shape.n_heads, shape.intermediate_size) == (512, 4, 8, 2048)
    with pytest.raises(ModelConfigError, match="encoder-decoder"):
        model_info_from_config({"model_type": "t5", "d_model": 512, "is_encoder_decoder": True})


def test_selective_keeps_input_attention_output_and_odd_matmuls() -> None:
    s = _setup(ac="selective", attn="flash")
    h, q, kv, i = 64, 64, 64, 256
    # q, k, v, o, gate, up, down: the 1st, 3rd, 5th, 7th outputs (q, v, gate, down) are kept
    kept = q + kv + i + h
    assert selective_layer_bytes(s) == 2 * h + 2 * q + 2 * kept
    every_2 = _setup(ac="selective", ac_every=2)  # one of the two layers checkpointed (2h), one whole
    assert activation_bytes_per_token_layer(every_2) == (2 * h + full_layer_bytes(every_2)) / 2


def test_offloaded_activations_keep_two_layers_on_the_gpu() -> None:
    layers = 6
    s = _setup(model=replace(_setup().model, n_layers=layers))
    off = replace(s, ac_offload=True)
    per_layer = s.micro_batch * s.seq * full_layer_bytes(s)
    assert held_activations(s) - held_activations(off) == (layers - 2) * per_layer
    assert offloaded_activations(off) == (layers - 2) * per_layer and offloaded_activations(s) == 0


def test_logits_term_is_12_vocab_bytes_per_token_or_2_chunked() -> None:
    tokens, vocab = 4 * 8, 100
    assert logits(_setup(micro_batch=4)) == 12 * vocab * tokens  # fp32 log-softmax, its grad, input grad
    assert logits(_setup(micro_batch=4, chunked_loss=True)) == 2 * vocab * tokens


def test_qlora_keeps_embeddings_and_lm_head_in_bf16() -> None:
    model = replace(_setup().model, params_embedding=100 * 64, tied_embeddings=False)
    s = _setup(model=model, method="qlora", lora_params=0)
    embedding = 2 * 100 * 64  # input embedding + untied lm_head, bf16
    weights = model_states(s)[0]
    assert weights == pytest.approx(2 * embedding + (P - embedding) * (0.5 + 1 / 64 + 4 / 16384))
    plain_nf4 = model_states(replace(s, double_quant=False))[0]
    assert plain_nf4 - weights == pytest.approx((P - embedding) * (4 / 64 - 1 / 64 - 4 / 16384))


def test_fsdp_without_frozen_reshard_holds_the_whole_frozen_base() -> None:
    s = _setup(method="lora", lora_params=0, precision="bf16", gpus=4, zero=3, sharding="full_shard")
    sharded = model_states(s)[0]
    kept = model_states(replace(s, frozen_reshard=False))[0]
    assert kept - sharded == 2 * P - 4 * 1000  # the gathered base, which covers the module in flight


def test_fsdp_mixed_shard_is_the_fp32_master_only() -> None:
    fsdp = _setup(gpus=4, zero=3, sharding="full_shard")
    deepspeed = _setup(gpus=4, zero=3)
    assert sum(model_states(deepspeed)[:3]) - sum(model_states(fsdp)[:3]) == 2 * P / 4


def test_flash_attention_has_no_mask_and_shares_o_proj_input() -> None:
    sdpa, flash = _setup(seq=512), _setup(seq=512, attn="flash")
    assert full_layer_bytes(sdpa) - full_layer_bytes(flash) == 2 * 512 + 2 * 64


def test_seq_auto_finds_the_longest_sequence_that_fits() -> None:
    from pitstop.plan.build import PlanRequest, build_plan
    from pitstop.plan.memory import memory

    plan = build_plan(PlanRequest(model="llama-3.1-8b", gpu="H100-SXM", seq="auto", method="qlora"))
    longest = plan.max_seq
    assert longest is not None and longest == plan.setup.seq
    gpu = float(plan.gpu.memory_bytes)
    assert memory(plan.setup, gpu).total <= gpu < memory(replace(plan.setup, seq=longest + 1), gpu).total


def test_allocated_leaves_out_context_nccl_and_fragmentation() -> None:
    from pitstop.plan.memory import memory

    m = memory(_setup(gpus=8, zero=3), 80 * 2**30)
    assert m.allocated == pytest.approx(m.total - m.margin)
