"""Packed rows must compute exactly what the examples compute alone: same logits, same per-token losses,
for every attention backend available on a CPU, on Llama, Qwen2 and GPT-2."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pitstop.data.collate import PackingCollator  # noqa: E402

LENGTHS = [[7, 12], [5, 9, 3]]


def _config(arch: str) -> Any:
    common = dict(vocab_size=300, num_hidden_layers=2, use_cache=False)
    if arch == "gpt2":
        return transformers.GPT2Config(
            n_embd=64, n_head=4, n_positions=128, bos_token_id=1, eos_token_id=2, **common
        )
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[arch]
    return cls(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, **common)


def _examples() -> list[Any]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 300, (n,), generator=g) for row in LENGTHS for n in row]


def _rows(examples: list[Any]) -> list[dict[str, Any]]:
    rows, k = [], 0
    for lens in LENGTHS:
        ids = torch.cat(examples[k : k + len(lens)])
        rows.append({"input_ids": ids, "labels": ids.clone(), "seq_lens": lens})
        k += len(lens)
    return rows


def _token_losses(logits: Any, labels: Any) -> Any:
    return torch.nn.functional.cross_entropy(logits[:-1].float(), labels[1:], reduction="none")


CASES = [(a, b) for a in ("llama", "qwen2") for b in ("sdpa", "eager", "flex_attention")] + [
    ("gpt2", "sdpa"),
    ("gpt2", "eager"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "attn"), CASES)
def test_packed_forward_equals_each_example_alone(arch: str, attn: str) -> None:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(arch), attn_implementation=attn).eval()
    examples = _examples()
    batch = PackingCollator(attn)(_rows(examples))
    with torch.no_grad():
        packed = model(**batch).logits
        k = 0
        for b, lens in enumerate(LENGTHS):
            start = 0
            for n in lens:
                alone = model(input_ids=examples[k][None]).logits[0]
                torch.testing.assert_close(packed[b, start : start + n], alone, atol=1e-5, rtol=1e-4)
                torch.testing.assert_close(
                    _token_losses(packed[b, start : start + n], examples[k]),
                    _token_losses(alone, examples[k]),
                    atol=1e-5,
                    rtol=1e-4,
                )
                start += n
                k += 1


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_packed_loss_is_the_unpacked_token_mean(arch: str) -> None:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(arch), attn_implementation="sdpa").eval()
    examples = _examples()
    with torch.no_grad():
        packed = model(**PackingCollator("sdpa")(_rows(examples))).loss
        per_token = torch.cat([_token_losses(model(input_ids=e[None]).logits[0], e) for e in examples])
    torch.testing.assert_close(packed, per_token.mean(), atol=1e-5, rtol=1e-5)


def test_a_boolean_mask_would_be_silently_wrong_in_eager() -> None:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        _config("llama"), attn_implementation="eager"
    ).eval()
    examples = _examples()
    batch = PackingCollator("sdpa")(_rows(examples))  # boolean mask handed to eager attention
    with torch.no_grad():
        wrong = model(**batch).logits[0, :7]
        alone = model(input_ids=examples[0][None]).logits[0]
    assert not torch.allclose(wrong, alone, atol=1e-3)


def test_padding_rows_stay_finite_and_ignored() -> None:
    rows = [
        {"input_ids": [5, 6, 7], "seq_lens": [3]},
        {"input_ids": [8, 9, 10, 11, 12, 13], "seq_lens": [2, 4]},
    ]
    for attn in ("sdpa", "eager"):
        batch = PackingCollator(attn)(rows)
        assert batch["labels"][0].tolist() == [-100, 6, 7, -100, -100, -100]
        assert batch["labels"][1].tolist() == [-100, 9, -100, 11, 12, 13]
        assert batch["position_ids"][1].tolist() == [0, 1, 0, 1, 2, 3]
        model = transformers.AutoModelForCausalLM.from_config(
            _config("llama"), attn_implementation=attn
        ).eval()
        with torch.no_grad():
            assert torch.isfinite(model(**batch).logits).all()


def test_flash_layout_flattens_with_cumulative_lengths() -> None:
    rows = [
        {"input_ids": [5, 6, 7], "seq_lens": [3]},
        {"input_ids": [8, 9, 10, 11, 12, 13], "seq_lens": [2, 4]},
    ]
    batch = PackingCollator("flash_attention_2")(rows)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10, 11, 12, 13]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3]]
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 5, 9] and batch["max_length_q"] == 4
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9, -100, 11, 12, 13]]
    assert "attention_mask" not in batch


def test_inconsistent_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="seq_lens add up"):
        PackingCollator("sdpa")([{"input_ids": [1, 2, 3], "seq_lens": [2]}])
    with pytest.raises(ValueError, match="no packing support"):
        PackingCollator("sparse_magic")
