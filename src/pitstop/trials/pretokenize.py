"""The ``pretokenize`` fix: examples that arrive as text are collated once each, before training, and the
loader then stacks the cached rows instead of tokenizing in the training loop.

It uses the job's own collate function on one example at a time, so the cached rows are exactly what the job
makes. That only holds for a collate that builds each row independently of the others (tokenize, truncate,
pad to a fixed length or to the batch's longest): before it is used, the cache is checked against the job's
collate on real batches, and left out where they differ. The one-off cost of building it is reported; in a
real run `pitstop data cache` builds it once for every run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

MAX_EXAMPLES = 200_000
MAX_BYTES = 2 << 30
CHECK_BATCHES = 2
PAD_VALUES = {"labels": -100}  # every other key pads with 0 (attention_mask, token_type_ids, most pad ids)


class CachedRows:
    """A map-style dataset of one-row batches (dicts of tensors with a leading dimension of 1)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]


class StackRows:
    """Collate cached rows: cut each row's own padding, pad to the batch's widest, stack."""

    def __init__(self, pad_values: Mapping[str, int], fixed_width: int | None) -> None:
        self.pad_values = dict(pad_values)
        self.fixed_width = fixed_width

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        import torch

        if self.fixed_width is not None:
            return {k: torch.cat([r[k] for r in rows]) for k in rows[0]}
        width = max(_real_width(r) for r in rows)
        out = {}
        for key in rows[0]:
            parts = []
            for r in rows:
                t = r[key][:, :width]
                if t.shape[1] < width:
                    pad = torch.full((1, width - t.shape[1]), self.pad_values.get(key, 0), dtype=t.dtype)
                    t = torch.cat([t, pad], dim=1)
                parts.append(t)
            out[key] = torch.cat(parts)
        return out


def _real_width(row: dict[str, Any]) -> int:
    mask = row.get("attention_mask")
    if mask is None:
        return int(row["input_ids"].shape[1])
    return int((mask != 0).sum())


def _same(a: Any, b: Any) -> bool:
    import torch

    if not isinstance(a, Mapping) or not isinstance(b, Mapping) or set(a.keys()) != set(b.keys()):
        return False
    return all(
        isinstance(a[k], torch.Tensor)
        and isinstance(b[k], torch.Tensor)
        and a[k].shape == b[k].shape
        and bool(torch.equal(a[k], b[k]))
        for k in a
    )


def collate_each(
    dataset: Any, collate: Callable[[list[Any]], Any], batch_size: int, seed: int
) -> tuple[list[dict[str, Any]], StackRows] | str:
    """Every example through the job's collate on its own, checked against its batches; or why not."""
    import random

    import torch

    n = len(dataset)
    if n > MAX_EXAMPLES:
        return f"{n:,} examples: cache them once with `pitstop data cache`"
    first = collate([dataset[0]])
    if not isinstance(first, Mapping) or not all(
        isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[0] == 1 for v in first.values()
    ):
        return "the collate does not return a dict of (rows × tokens) tensors"
    per_row = sum(v.numel() * v.element_size() for v in first.values())
    if per_row * n > MAX_BYTES:
        return f"the cache would take {per_row * n / 2**30:.1f} GiB: build it with `pitstop data cache`"
    rows = [dict(first)] + [dict(collate([dataset[i]])) for i in range(1, n)]
    widths = {int(r["input_ids"].shape[1]) for r in rows} if "input_ids" in first else {0}
    rng = random.Random(seed)
    checks = [rng.sample(range(n), min(batch_size, n)) for _ in range(CHECK_BATCHES)]
    batches = [collate([dataset[i] for i in picked]) for picked in checks]
    pad_values = dict(PAD_VALUES)
    if len(widths) > 1:  # padded per batch: learn the job's pad values where its batches pad
        pad_values.update(learned_pad_values(batches))
    stack = StackRows(pad_values, next(iter(widths)) if len(widths) == 1 else None)
    for picked, batch in zip(checks, batches, strict=True):
        if not _same(batch, stack([rows[i] for i in picked])):
            return "the collate does not build each row on its own (cached rows differ from its batches)"
    return rows, stack


def learned_pad_values(batches: list[Any]) -> dict[str, int]:
    """Each key's value at the padded positions of the job's own batches (its pad token id, -100, 0…)."""
    found: dict[str, int] = {}
    for batch in batches:
        mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
        if mask is None:
            continue
        padded = mask == 0
        for key, value in batch.items():
            if key not in found and getattr(value, "shape", None) == mask.shape and bool(padded.any()):
                found[key] = int(value[padded][0])
    return found


def build_cache(
    dataset: Any, collate: Callable[[list[Any]], Any], batch_size: int, seed: int
) -> tuple[CachedRows, StackRows, float] | str:
    """The cached dataset, its collate and the seconds the build took; or why it cannot be cached."""
    started = time.perf_counter()
    built = collate_each(dataset, collate, batch_size, seed)
    if isinstance(built, str):
        return built
    rows, stack = built
    return CachedRows(rows), stack, time.perf_counter() - started


class PackedExamples:
    """Whole examples packed into rows of at most ``max_len`` tokens (best-fit decreasing), as
    ``{"input_ids", "labels", "seq_lens"}`` for ``pitstop.data.PackingCollator``."""

    def __init__(self, ids: list[Any], labels: list[Any], max_len: int, pad_token_id: int) -> None:
        from pitstop.data import plan_packing

        self.ids, self.labels = ids, labels
        self.pad_token_id = pad_token_id
        self.max_len = max_len  # the row length the examples were packed into (the change tune keeps says it)
        self.bins = plan_packing([len(x) for x in ids], max_len).bins

    def __len__(self) -> int:
        return len(self.bins)

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        members = self.bins[i]
        return {
            "input_ids": torch.cat([self.ids[j] for j in members]),
            "labels": torch.cat([self.labels[j] for j in members]),
            "seq_lens": [len(self.ids[j]) for j in members],
        }


def build_packed(
    dataset: Any, collate: Callable[[list[Any]], Any], batch_size: int, seed: int
) -> tuple[PackedExamples, float] | str:
    """The job's examples, each collated alone, stripped of padding and packed into rows as long as the
    job's rows (its fixed padded length, or its longest example)."""
    started = time.perf_counter()
    built = collate_each(dataset, collate, batch_size, seed)
    if isinstance(built, str):
        return built
    rows, stack = built
    if not rows or not set(rows[0]) <= {"input_ids", "attention_mask", "labels"}:
        return "the job's rows carry more than input_ids, attention_mask and labels"
    ids, labels = [], []
    pad_token_id = 0
    for row in rows:
        n = _real_width(row)
        if n < row["input_ids"].shape[1]:
            pad_token_id = int(row["input_ids"][0, n])  # the job's own pad id: the probe counts by it
        if "attention_mask" in row and bool((row["attention_mask"][0, :n] == 0).any()):
            return "the job's rows are not right-padded"
        ids.append(row["input_ids"][0, :n])
        labels.append(row.get("labels", row["input_ids"])[0, :n])
    max_len = stack.fixed_width or max(len(x) for x in ids)
    return PackedExamples(ids, labels, max_len, pad_token_id), time.perf_counter() - started
