"""Collate wrappers that remove padding from the batches a job already builds, without touching its code.

Both keep every example and every labelled token of the batch, so a Hugging Face causal-LM loss (the mean
over labelled tokens) is the same:

* :class:`TrimPadding` cuts the columns that are padding in every row of a right-padded batch. Causal
  attention never lets a real token see a later position, so the real tokens compute exactly what they did.
* :class:`PackBatch` concatenates the batch's examples into padding-free rows, with positions restarting
  per example and attention kept inside each example (``pitstop.data.PackingCollator``). With a varlen
  attention (FlashAttention's, flex) the whole batch is one row: each example's attention costs its own L².
  With a dense mask (SDPA, eager) a row's attention costs its whole width squared, so the examples are laid
  first-fit into rows no wider than the batch's padded rows, as packing a dataset into rows of that length
  does: one row of the whole batch would attend over more positions than the padded batch did (a padded
  batch of 8 × 256 with 544 real tokens: 8 · 256² = 524k scores, one packed row 544² = 296k, three rows of
  at most 256, padded to the longest of them: 3 · 244² = 179k).

Both are module-level classes so DataLoader workers can pickle them under any start method.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

PACKABLE_KEYS = {"input_ids", "attention_mask", "labels"}


def right_padded_lengths(batch: Any) -> tuple[Any, Any] | None:
    """(input_ids, real lengths) when the batch is a mapping with a 2-D attention mask whose ones form a
    prefix of every row; None otherwise (left padding, no mask, 4-D masks: left alone)."""
    if not isinstance(batch, MutableMapping) and not (
        hasattr(batch, "keys") and hasattr(batch, "__setitem__")
    ):
        return None
    ids, mask = batch.get("input_ids"), batch.get("attention_mask")
    if not all(hasattr(x, "dim") for x in (ids, mask)) or ids.dim() != 2 or mask.shape != ids.shape:
        return None
    real = mask != 0
    if ids.shape[1] > 1 and bool((real[:, 1:] & ~real[:, :-1]).any()):
        return None  # a real token after a pad: not right padding
    return ids, real.sum(dim=1)


class TrimPadding:
    def __init__(self, inner: Callable[[Any], Any]) -> None:
        self.inner = inner

    def __call__(self, samples: Any) -> Any:
        return trim_padding(self.inner(samples))


def trim_padding(batch: Any) -> Any:
    found = right_padded_lengths(batch)
    if found is None:
        return batch
    ids, lengths = found
    rows, width = ids.shape
    keep = int(lengths.max()) if rows else width
    if keep >= width:
        return batch
    tensors = {k: v for k, v in batch.items() if hasattr(v, "dim")}
    if any(v.dim() > 2 and width in v.shape[1:] for v in tensors.values()):
        return batch  # a 4-D mask or per-position features we cannot cut consistently
    for key, value in tensors.items():
        if value.dim() == 2 and value.shape == (rows, width):
            batch[key] = value[:, :keep].contiguous()
    return batch


class PackBatch:
    def __init__(self, inner: Callable[[Any], Any], attn: str, pad_token_id: int = 0) -> None:
        self.inner = inner
        self.attn = attn
        self.pad_token_id = pad_token_id

    def __call__(self, samples: Any) -> Any:
        return pack_batch(self.inner(samples), self.attn, self.pad_token_id)


def pack_batch(batch: Any, attn: str, pad_token_id: int = 0) -> Any:
    """One padding-free row holding the batch's examples; the batch unchanged when it is not a plain
    right-padded causal-LM batch (input_ids, attention_mask, labels and nothing else)."""
    from pitstop.data.collate import PackingCollator

    found = right_padded_lengths(batch)
    if found is None or set(batch.keys()) != PACKABLE_KEYS:
        return batch
    ids, lengths = found
    labels = batch["labels"]
    if labels.shape != ids.shape:
        return batch
    import torch

    from pitstop.data.collate import FLASH

    lens = [int(n) for n in lengths]
    if not any(lens):
        return batch  # no example left to pack (every row is padding)
    width = None if attn in (*FLASH, "flex_attention") else ids.shape[1]
    rows = [
        {
            "input_ids": torch.cat([ids[b, : lens[b]] for b in members]),
            "labels": torch.cat([labels[b, : lens[b]] for b in members]),
            "seq_lens": [lens[b] for b in members],
        }
        for members in first_fit([b for b, n in enumerate(lens) if n], lens, width)
    ]
    return PackingCollator(attn, pad_token_id)(rows)


def first_fit(examples: list[int], lens: list[int], width: int | None) -> list[list[int]]:
    """The examples (indices into ``lens``) in rows of at most ``width`` tokens, each into the first row it
    fits, in the batch's order; one row of them all when ``width`` is None."""
    if width is None:
        return [examples]
    rows: list[list[int]] = []
    room: list[int] = []
    for b in examples:
        at = next((i for i, free in enumerate(room) if free >= lens[b]), None)
        if at is None:
            rows.append([b])
            room.append(width - lens[b])
        else:
            rows[at].append(b)
            room[at] -= lens[b]
    return rows


BUCKET_MIN = 16  # the shortest bucket length


def bucket_length(width: int) -> int:
    """The bucket a batch of ``width`` columns is padded to: the next power of two or 1.5 times one (16, 24,
    32, 48, 64, 96, ...), so a job's lengths take a few shapes (two per doubling) at under 50% more columns."""
    if width <= BUCKET_MIN:
        return BUCKET_MIN
    power = 1 << (width - 1).bit_length()  # the next power of two at or above width
    half_step = power // 4 * 3  # 1.5 times the power of two below it
    return half_step if width <= half_step and half_step >= BUCKET_MIN else power


class PadToBucket:
    """Pads each right-padded batch to its bucket length (``bucket_length``), so torch.compile sees a few
    shapes instead of one per batch. Every example and labelled token stays: the new columns are padding
    (masked, labels -100) after every real token, which causal attention never lets a real token see."""

    def __init__(self, inner: Callable[[Any], Any]) -> None:
        self.inner = inner

    def __call__(self, samples: Any) -> Any:
        return pad_to_bucket(self.inner(samples))


# what each 2-D key's new columns hold; a batch with any other 2-D key of the batch's width is left alone
_FILL = {"attention_mask": 0, "labels": -100, "token_type_ids": 0}


def pad_to_bucket(batch: Any) -> Any:
    found = right_padded_lengths(batch)
    if found is None:
        return batch
    ids, lengths = found
    rows, width = ids.shape
    target = bucket_length(width)
    if target <= width:
        return batch
    tensors = {k: v for k, v in batch.items() if hasattr(v, "dim")}
    if any(v.dim() > 2 and width in v.shape[1:] for v in tensors.values()):
        return batch  # a 4-D mask or per-position features we cannot extend consistently
    wide = {k: v for k, v in tensors.items() if v.dim() == 2 and v.shape == (rows, width)}
    if any(k not in _FILL and k not in ("input_ids", "position_ids") for k in wide):
        return batch
    import torch

    extra = target - width
    short = bool((lengths < width).any())
    # the id the job pads with where a row has padding; else any id (the new columns are masked)
    pad_id = int(ids[lengths.argmin(), width - 1]) if short else int(ids[0, 0])
    for key, value in wide.items():
        if key == "position_ids":
            more = value[:, -1:] + torch.arange(1, extra + 1, dtype=value.dtype, device=value.device)
        else:
            fill = pad_id if key == "input_ids" else _FILL[key]
            more = torch.full((rows, extra), fill, dtype=value.dtype, device=value.device)
        batch[key] = torch.cat([value, more], dim=1)
    return batch


def wrapped_collate(params: dict[str, Any]) -> Any | None:
    """The job's collate function a trial is about to wrap (the DataLoader's default where it set none), or
    None where a trial already wrapped it: a loader rebuilt from a loader a trial changed is left alone."""
    from torch.utils.data import default_collate

    collate = params.get("collate_fn") or default_collate
    return None if isinstance(collate, TrimPadding | PackBatch | PadToBucket) else collate
