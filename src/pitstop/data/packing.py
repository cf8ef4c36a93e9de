"""Best-fit-decreasing packing of examples into rows of at most ``max_len`` tokens.

Planned over the whole dataset at once: examples are placed longest first, each into the open row with
the least room that still fits it (a new row when none does). Examples are never split here; one longer
than ``max_len`` is left out and counted, so the caller decides to truncate or drop it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class PackingPlan:
    bins: list[list[int]]  # indices into the lengths given, per packed row
    max_len: int
    total_tokens: int
    too_long: list[int] = field(default_factory=list)

    @property
    def lower_bound(self) -> int:
        """No plan can use fewer rows than ceil(total tokens / max_len)."""
        return math.ceil(self.total_tokens / self.max_len) if self.total_tokens else 0

    @property
    def efficiency(self) -> float:
        """Share of the rows' token slots that hold real tokens."""
        return self.total_tokens / (len(self.bins) * self.max_len) if self.bins else 1.0


def plan_packing(lengths: Sequence[int], max_len: int) -> PackingPlan:
    if max_len <= 0:
        raise ValueError("max_len must be positive")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    # open rows sorted by remaining room: parallel lists so bisect finds the tightest fit
    rooms: list[int] = []
    ids: list[int] = []
    too_long: list[int] = []
    total = 0
    for i in order:
        n = lengths[i]
        if n > max_len:
            too_long.append(i)
            continue
        if n <= 0:
            continue
        total += n
        pos = bisect.bisect_left(rooms, n)
        if pos < len(rooms):
            room, b = rooms.pop(pos), ids.pop(pos)
        else:
            room, b = max_len, len(bins)
            bins.append([])
        bins[b].append(i)
        room -= n
        if room > 0:
            at = bisect.bisect_left(rooms, room)
            rooms.insert(at, room)
            ids.insert(at, b)
    return PackingPlan(bins=bins, max_len=max_len, total_tokens=total, too_long=sorted(too_long))
