"""Counting rows, tokens and real tokens in the batch shapes real training code hands over."""

from __future__ import annotations

import pytest

from pitstop.data.rawtext import looks_like_text
from pitstop.probe.batch import count_batch, count_model_inputs, rows_first_fit

torch = pytest.importorskip("torch")


def test_attention_mask_gives_real_tokens() -> None:
    ids = torch.ones(2, 5, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    labels = torch.tensor([[-100, 2, 3, -100, -100], [-100, -100, 3, 4, 5]])
    c = count_batch({"input_ids": ids, "attention_mask": mask, "labels": labels})
    assert (c.samples, c.tokens, c.real_tokens, c.loss_tokens, c.examples, c.seq_len) == (2, 10, 8, 5, 2, 5)
    assert c.nbytes == 3 * 10 * 8


def test_padded_rows_say_how_many_rows_packing_at_their_width_would_fill() -> None:
    """Examples of 100, 100, 100, 60 and 20 tokens in rows of 256, each into the first row it fits: 100 + 100
    + 20 and 100 + 60, two rows where there were five (the last keeps its padding)."""
    lengths = [100, 100, 100, 60, 20]
    mask = torch.tensor([[1] * n + [0] * (256 - n) for n in lengths])
    ids = torch.where(mask.bool(), 7, 0)
    assert count_batch({"input_ids": ids, "attention_mask": mask}).packed_rows == 2
    assert count_batch({"input_ids": ids}, pad_token_id=0).packed_rows == 2
    assert count_batch({"input_ids": ids}).packed_rows is None  # its padding cannot be told
    packed = count_batch({"input_ids": ids[:1], "position_ids": torch.arange(256).unsqueeze(0)})
    assert packed.packed_rows is None  # already packed: nothing to say
    assert rows_first_fit([256, 0, 256], 256) == 2 and rows_first_fit([0, 0], 256) == 0


def test_batch_encoding_is_read_like_a_dict() -> None:
    from transformers import BatchEncoding

    enc = BatchEncoding(
        {"input_ids": torch.ones(1, 4, dtype=torch.long), "attention_mask": torch.tensor([[1, 1, 0, 0]])}
    )
    assert count_batch(enc).real_tokens == 2


def test_packed_rows_count_examples_and_skip_the_padded_tail() -> None:
    ids = torch.tensor([[5, 6, 7, 8, 9, 0, 0]])
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1]])
    c = count_batch({"input_ids": ids, "position_ids": pos}, pad_token_id=0)
    assert (c.tokens, c.real_tokens, c.examples) == (7, 5, 2)
    no_pad_id = count_batch({"input_ids": ids[:, :5], "position_ids": pos[:, :5]})
    assert (no_pad_id.real_tokens, no_pad_id.examples) == (5, 2)


def test_packed_tail_is_found_without_a_pad_token_id() -> None:
    # PackingCollator's rows: examples with their first label ignored, then a tail of one repeated id
    ids = torch.tensor([[5, 6, 7, 8, 9, 3, 3], [5, 6, 7, 8, 9, 4, 2]])
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1], [0, 1, 2, 0, 1, 0, 1]])
    labels = torch.tensor([[-100, 6, 7, -100, 9, -100, -100], [-100, 6, 7, -100, 9, -100, 2]])
    c = count_batch({"input_ids": ids, "position_ids": pos, "labels": labels})
    assert (c.tokens, c.real_tokens, c.examples) == (14, 12, 5)  # row 2 ends in a real, labelled example


def test_pad_token_id_without_mask() -> None:
    ids = torch.tensor([[4, 5, 0, 0]])
    assert count_batch({"input_ids": ids}, pad_token_id=0).real_tokens == 2


def test_a_batch_without_mask_has_every_token_attended() -> None:
    # the pretraining loop: model(input_ids=x, labels=x) on full-length blocks, a model without a pad id
    x = torch.randint(3, 500, (2, 8))
    c = count_batch({"input_ids": x, "labels": x})
    assert (c.tokens, c.real_tokens, c.loss_tokens) == (16, 16, 16)
    assert count_batch(x).real_tokens == 16  # a bare tensor of ids too


def test_a_padded_tail_without_mask_is_told_by_its_ignored_labels() -> None:
    # padded with the end-of-sequence id (no pad id of its own), labels -100 there, no attention mask
    ids = torch.tensor([[5, 6, 7, 2, 2, 2], [5, 6, 7, 8, 9, 2]])
    labels = torch.tensor([[5, 6, 7, 2, -100, -100], [5, 6, 7, 8, 9, 2]])
    c = count_batch({"input_ids": ids, "labels": labels})
    assert (c.tokens, c.real_tokens, c.loss_tokens) == (12, 10, 10)
    # ignored labels in the middle (a masked prompt) are not padding
    prompt = torch.tensor([[-100, -100, 7, 2, 2, 2]])
    assert count_batch({"input_ids": ids[:1], "labels": prompt}).real_tokens == 6


def test_tuple_batches_and_non_token_batches() -> None:
    x = torch.ones(4, 16, dtype=torch.long)
    c = count_batch((x, x.clone()))
    assert (c.samples, c.tokens, c.loss_tokens) == (4, 64, 64)
    images = count_batch((torch.zeros(8, 3, 4, 4), torch.zeros(8, dtype=torch.long)))
    assert images.samples == 8 and images.tokens is None


def test_looks_like_text() -> None:
    assert looks_like_text([{"instruction": "hi", "response": "there"}])
    assert looks_like_text(["raw text"])
    assert not looks_like_text([{"input_ids": [1, 2, 3]}])
    assert not looks_like_text([{"input_ids": [1, 2], "text": "kept for debugging"}])
    assert not looks_like_text([])


def test_model_inputs_positional_x_y_with_targets_ignored_at_minus_one() -> None:
    x = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]])
    y = torch.tensor([[-1, -1, 8, 9], [6, 7, 8, 9]])
    c = count_model_inputs((x, y), {}, ("idx", "targets"))
    assert (c.samples, c.tokens, c.real_tokens, c.loss_tokens, c.nbytes) == (2, 8, 8, 6, 0)


def test_model_inputs_by_name_keyword_or_positional() -> None:
    ids = torch.ones(2, 5, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    by_position = count_model_inputs((ids, mask), {}, ("input_ids", "attention_mask"))
    by_keyword = count_model_inputs((), {"input_ids": ids, "attention_mask": mask}, ("self",))
    assert by_position.real_tokens == by_keyword.real_tokens == 8 and by_position.loss_tokens is None
    embeds = count_model_inputs((), {"inputs_embeds": torch.zeros(2, 5, 3), "attention_mask": mask}, ())
    assert (embeds.samples, embeds.tokens, embeds.real_tokens) == (2, 10, 8)
    images = count_model_inputs((torch.zeros(3, 1, 8, 8),), {}, ("x",))  # no tokens: rows only
    assert (images.samples, images.tokens) == (3, None)
