"""Best-fit-decreasing packing of examples into rows of at most ``max_len`` tokens, planned over the whole
dataset at once.

Plain best-fit decreasing (longest first, each into the open row with the least room that still fits it)
costs a search per example. Lengths are integers no larger than ``max_len``, which allows the same plan in
bulk: examples are taken one length at a time, and rows are kept in buckets by remaining room. For a length
L, the tightest rows (smallest room ≥ L) are visited in order; a row with room r takes ⌊r/L⌋ examples of
that length at once (exactly what example-by-example best fit would give it, since after each placement
that row is still the tightest fit), and new rows are opened for the rest. The work is O(examples +
distinct lengths × max_len / vector width): a million examples plan in a fraction of a second.

Examples longer than ``max_len`` are truncated (default), split into ``max_len`` pieces, or dropped, and
counted either way. Empty examples are skipped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import numpy as np

Overflow = Literal["truncate", "split", "drop"]


@dataclass
class PackingPlan:
    piece_rows: list[list[int]]  # per packed row, indices of the pieces in it
    piece_example: Any  # numpy int64: the example each piece comes from
    piece_start: Any  # numpy int64: where the piece starts inside its example (split pieces)
    piece_length: Any  # numpy int64: the piece's token count as packed
    max_len: int
    too_long: list[int] = field(default_factory=list)  # examples longer than max_len
    overflow: Overflow = "truncate"
    dropped_tokens: int = 0
    seconds: float = 0.0

    @cached_property
    def bins(self) -> list[list[int]]:
        """Per packed row, the indices (into the lengths given) of the examples in it."""
        if np.array_equal(self.piece_example, np.arange(self.piece_example.size)):
            return self.piece_rows
        example = self.piece_example.tolist()
        return [[example[p] for p in row] for row in self.piece_rows]

    @property
    def rows(self) -> list[list[tuple[int, int, int]]]:
        """Per packed row, (example, start token, length) of each piece."""
        ex, st, ln = self.piece_example.tolist(), self.piece_start.tolist(), self.piece_length.tolist()
        return [[(ex[p], st[p], ln[p]) for p in row] for row in self.piece_rows]

    @property
    def total_tokens(self) -> int:
        return int(self.piece_length.sum())

    @property
    def lower_bound(self) -> int:
        """No plan can use fewer rows than ceil(total tokens / max_len)."""
        return math.ceil(self.total_tokens / self.max_len) if self.total_tokens else 0

    @property
    def efficiency(self) -> float:
        """Share of the rows' token slots that hold real tokens."""
        return self.total_tokens / (len(self.piece_rows) * self.max_len) if self.piece_rows else 1.0

    def to_dict(self, with_bins: bool = True) -> dict[str, object]:
        doc: dict[str, object] = {
            "rows": len(self.piece_rows),
            "lower_bound": self.lower_bound,
            "efficiency": round(self.efficiency, 6),
            "max_len": self.max_len,
            "total_tokens": self.total_tokens,
            "too_long": len(self.too_long),
            "overflow": self.overflow,
            "dropped_tokens": self.dropped_tokens,
            "seconds": round(self.seconds, 6),
        }
        if with_bins:
            doc["bins"] = self.bins
        return doc


def _pieces(lengths: Any, max_len: int, overflow: Overflow) -> tuple[Any, Any, Any, list[int], int]:
    """(example, start, length) of every piece to pack, vectorized; plus too-long examples, dropped tokens."""
    n = np.asarray(lengths, dtype=np.int64)
    index = np.arange(n.size, dtype=np.int64)
    long_mask = n > max_len
    too_long = index[long_mask].tolist()
    keep = n > 0
    if overflow == "drop":
        dropped = int(n[long_mask].sum())
        keep &= ~long_mask
        return index[keep], np.zeros(int(keep.sum()), dtype=np.int64), n[keep], too_long, dropped
    if overflow == "truncate":
        dropped = int((n[long_mask] - max_len).sum())
        return (
            index[keep],
            np.zeros(int(keep.sum()), dtype=np.int64),
            np.minimum(n[keep], max_len),
            too_long,
            dropped,
        )
    ex, length = index[keep], n[keep]
    count = -(-length // max_len)  # pieces per example
    piece_ex = np.repeat(ex, count)
    first = np.repeat(np.cumsum(count) - count, count)
    k = np.arange(piece_ex.size, dtype=np.int64) - first  # which piece of its example
    start = k * max_len
    piece_len = np.minimum(np.repeat(length, count) - start, max_len)
    return piece_ex, start, piece_len, too_long, 0


def plan_packing(lengths: Sequence[int] | Any, max_len: int, overflow: Overflow = "truncate") -> PackingPlan:
    """Best-fit-decreasing rows of whole examples (see the module docstring for how it stays fast)."""
    if max_len <= 0:
        raise ValueError("max_len must be positive")
    if overflow not in ("truncate", "split", "drop"):
        raise ValueError(f"overflow must be truncate, split or drop, not {overflow!r}")
    started = time.perf_counter()
    piece_ex, piece_start, piece_len, too_long, dropped = _pieces(lengths, max_len, overflow)
    rows: list[list[int]] = []
    # rooms[r]: rows with exactly r token slots left (r > 0); count mirrors their sizes for vector search
    rooms: list[list[int]] = [[] for _ in range(max_len + 1)]
    count = np.zeros(max_len + 1, dtype=np.int64)
    if piece_len.size:
        order = np.argsort(-piece_len, kind="stable")  # longest first; ties keep input order
        sorted_lengths = piece_len[order]
        change = np.flatnonzero(np.diff(sorted_lengths)) + 1
        starts = np.concatenate(([0], change)).tolist()
        ends = np.concatenate((change, [piece_len.size])).tolist()
        order_list = order.tolist()
        for start, end in zip(starts, ends, strict=True):
            size = int(sorted_lengths[start])
            items = order_list[start:end]
            pos, n_items = 0, len(items)
            for room in (np.flatnonzero(count[size:]) + size).tolist():
                stack = rooms[room]
                while stack and pos < n_items:
                    row = stack.pop()
                    take = min(room // size, n_items - pos)
                    rows[row].extend(items[pos : pos + take])
                    pos += take
                    left = room - take * size
                    count[room] -= 1
                    if left:
                        rooms[left].append(row)
                        count[left] += 1
                if pos == n_items:
                    break
            per_row = max_len // size
            while pos < n_items:  # no open row fits: open new ones, each filled as best fit would
                take = min(per_row, n_items - pos)
                rows.append(items[pos : pos + take])
                pos += take
                left = max_len - take * size
                if left:
                    rooms[left].append(len(rows) - 1)
                    count[left] += 1
    return PackingPlan(
        piece_rows=rows,
        piece_example=piece_ex,
        piece_start=piece_start,
        piece_length=piece_len,
        max_len=max_len,
        too_long=too_long,
        overflow=overflow,
        dropped_tokens=dropped,
        seconds=time.perf_counter() - started,
    )


def shuffled_rows(n_rows: int, seed: int, epoch: int) -> list[int]:
    """A seeded order of packed rows for one epoch (a different order every epoch, the same on every rank)."""
    rng = np.random.default_rng([seed, epoch])
    return rng.permutation(n_rows).tolist()
