"""Across ranks: align the clocks, measure who arrives late at each collective, and summarize many ranks.

* Matching: the k-th collective of one kind, on one process group, in profiler step N is the same
  collective on every rank of that group (NCCL requires all ranks to issue collectives in the same order).
* Clocks: CUPTI timestamps of different hosts differ by up to milliseconds. All ranks leave a collective
  together (nobody can finish an all-reduce before the last rank joined), so a rank's clock offset is the
  median difference of its collective ends from the reference rank's (the lowest rank; ranks that share no
  collective with it are aligned through ranks that do).
* Arrival: a collective kernel starts when its rank's stream reaches it; the last rank to start is the one
  every other rank waits for. Per rank: how much later than the median rank it arrives, how often it is last,
  and how long its own collectives waited for the last one.
* Bus bandwidth: message bytes over the time from the last arrival to the end, scaled as NCCL-tests does
  (all-reduce 2(n-1)/n, all-gather / reduce-scatter / all-to-all (n-1)/n).
"""

from __future__ import annotations

import statistics
from collections import defaultdict

import numpy as np

from pitstop.trace.events import COLLECTIVE_KINDS
from pitstop.trace.summary import RankSummary

_BUS_FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n}
for _kind in ("allgather", "reducescatter", "alltoall"):
    _BUS_FACTOR[_kind] = lambda n: (n - 1) / n


def _table(summaries: list[RankSummary]) -> dict[str, np.ndarray]:
    """All ranks' collectives in one table, with a key id shared by the same collective on every rank."""
    keys: dict[tuple[str, int, int, int], int] = {}
    cols: dict[str, list[np.ndarray]] = defaultdict(list)
    for r, s in enumerate(summaries):
        c = s.coll
        if not c or c["ts"].size == 0:
            continue
        ids = np.fromiter(
            (
                keys.setdefault((s.groups[g], k, st, q), len(keys))
                for g, k, st, q in zip(
                    c["group"].tolist(),
                    c["kind"].tolist(),
                    c["step"].tolist(),
                    c["seq"].tolist(),
                    strict=True,
                )
            ),
            dtype=np.int64,
            count=c["ts"].size,
        )
        cols["key"].append(ids)
        cols["rank"].append(np.full(ids.size, r, dtype=np.int64))
        for name in ("ts", "end", "nbytes", "group_size", "kind"):
            cols[name].append(c[name])
    if not cols:
        return {}
    table = {k: np.concatenate(v) for k, v in cols.items()}
    order = np.argsort(table["key"], kind="stable")
    return {k: v[order] for k, v in table.items()}


def _offsets(t: dict[str, np.ndarray], n_ranks: int, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each rank's clock offset from the first rank with collectives, through shared collectives."""
    offset = np.full(n_ranks, np.nan)
    ref = int(t["rank"].min())
    offset[ref] = 0.0
    key_of_row = np.repeat(np.arange(starts.size), counts)
    for _ in range(n_ranks):
        known = ~np.isnan(offset[t["rank"]])
        if known.all():
            break
        shifted = np.where(known, t["end"] - offset[t["rank"]], 0.0)
        total = np.add.reduceat(shifted, starts)
        seen = np.add.reduceat(known.astype(np.int64), starts)
        key_end = np.where(seen > 0, total / np.maximum(seen, 1), np.nan)[key_of_row]
        candidate = ~known & ~np.isnan(key_end)
        if not candidate.any():
            break
        diffs = t["end"][candidate] - key_end[candidate]
        ranks = t["rank"][candidate]
        order = np.argsort(ranks, kind="stable")
        ranks, diffs = ranks[order], diffs[order]
        bounds = np.flatnonzero(np.diff(ranks)) + 1
        for r, d in zip(ranks[np.r_[0, bounds]].tolist(), np.split(diffs, bounds), strict=True):
            offset[r] = float(np.median(d))
    return offset


def cross_rank(summaries: list[RankSummary]) -> list[str]:
    """Fill the cross-rank TraceStats fields of every rank; notes that summarize the ranks."""
    notes = summarize_ranks(summaries)
    t = _table(summaries)
    if not t:
        return notes
    n = len(summaries)
    keys, starts, counts = np.unique(t["key"], return_index=True, return_counts=True)
    offset = _offsets(t, n, starts, counts)
    aligned = ~np.isnan(offset[t["rank"]])
    shared = np.repeat(counts >= 2, counts) & aligned
    if not shared.any():
        return notes
    t = {k: v[shared] for k, v in t.items()}
    keys, starts, counts = np.unique(t["key"], return_index=True, return_counts=True)
    arrive = t["ts"] - offset[t["rank"]]
    leave = t["end"] - offset[t["rank"]]
    last = np.repeat(np.maximum.reduceat(arrive, starts), counts)
    first = np.repeat(np.minimum.reduceat(arrive, starts), counts)
    # the median arrival per collective: sort arrivals inside each key
    order = np.lexsort((arrive, np.repeat(np.arange(keys.size), counts)))
    sorted_arrive = arrive[order]
    mid_lo = starts + (counts - 1) // 2
    mid_hi = starts + counts // 2
    median = np.repeat((sorted_arrive[mid_lo] + sorted_arrive[mid_hi]) / 2, counts)
    is_last = arrive >= last
    wait = last - arrive
    late = arrive - median
    transfer = np.maximum(leave - last, 0.0)
    factor = np.ones(t["kind"].size)
    sizes = t["group_size"]
    for code, kind in enumerate(COLLECTIVE_KINDS):
        fn = _BUS_FACTOR.get(kind)
        if fn is not None:
            m = (t["kind"] == code) & (sizes > 1)
            factor[m] = fn(sizes[m].astype(np.float64))
    sized = (t["nbytes"] > 0) & (transfer > 0)
    skew_ms, late_ms = [], []
    for r, s in enumerate(summaries):
        stats = s.profile.trace
        rows = t["rank"] == r
        if stats is None or not rows.any():
            continue
        steps = max(len(s.profile.steps), 1)
        stats.collectives = int(rows.sum())
        stats.clock_offset_us = round(float(offset[r]), 3)
        stats.arrival_skew_ms = float(np.mean((last - first)[rows])) / 1000.0
        stats.arrival_late_ms = float(np.mean(late[rows])) / 1000.0
        stats.last_arrival_frac = float(np.mean(is_last[rows]))
        stats.collective_wait_ms = float(np.sum(wait[rows])) / steps / 1000.0
        if stats.nccl_ms is not None and stats.nccl_overlap_frac is not None:
            exposed = stats.nccl_ms * (1.0 - stats.nccl_overlap_frac)
            stats.exposed_comm_ms = max(exposed - stats.collective_wait_ms, 0.0)
        rs = rows & sized
        if rs.any():
            stats.bus_bandwidth_gbps = float(
                np.sum(t["nbytes"][rs] * factor[rs]) / np.sum(transfer[rs]) / 1e3
            )  # bytes per us -> GB/s
        skew_ms.append(stats.arrival_skew_ms)
        late_ms.append((stats.arrival_late_ms, s.rank))
    spread = np.nanmax(offset) - np.nanmin(offset)
    unaligned = [summaries[i].rank for i in np.flatnonzero(np.isnan(offset))]
    note = (
        f"clocks aligned on {keys.size} collectives seen by several ranks (offsets span {spread:.0f} us); "
        f"arrival skew {statistics.median(skew_ms):.2f} ms per collective (median over ranks)"
    )
    if late_ms:
        worst, rank = max(late_ms)
        note += f"; the latest rank is {rank}, {worst:.2f} ms after the median rank on average"
    notes.append(note)
    if unaligned:
        notes.append(f"ranks {rank_ranges(unaligned)} share no collective with the others: not aligned")
    return notes


def rank_ranges(ranks: list[int] | tuple[int, ...]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8' (512 ranks stay on one line)."""
    out: list[str] = []
    values = sorted(set(ranks))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(out)


def summarize_ranks(summaries: list[RankSummary]) -> list[str]:
    """A few lines that stay readable at 512 ranks: step time of the fastest, median and slowest rank, the
    spread, outliers (median absolute deviation), and each limitation once with the ranks it applies to."""
    notes: list[str] = []
    by_limit: dict[str, list[int]] = defaultdict(list)
    for s in summaries:
        if s.profile.trace is not None:
            for limit in s.profile.trace.limitations:
                by_limit[limit].append(s.rank)
    for limit, ranks in by_limit.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)}"
        notes.append(f"{who}: {limit}")
    steps = {
        s.rank: 1000 * mean_s
        for s in summaries
        if s.profile.trace is not None and (mean_s := s.profile.mean_step_s) is not None
    }
    if len(steps) < 2:
        return notes
    values = np.array(list(steps.values()))
    ranks = list(steps)
    med = float(np.median(values))
    fast, slow = ranks[int(np.argmin(values))], ranks[int(np.argmax(values))]
    mad = float(np.median(np.abs(values - med))) or 1e-9
    outliers = sorted(
        (r for r, v in steps.items() if abs(v - med) > max(5 * mad, 0.02 * med)),
        key=lambda r: -abs(steps[r] - med),
    )
    spread = (steps[slow] - steps[fast]) / med if med else 0.0
    line = (
        f"{len(steps)} ranks: step {med:.1f} ms median, fastest rank {fast} {steps[fast]:.1f} ms, slowest rank "
        f"{slow} {steps[slow]:.1f} ms (spread {spread:.0%})"
        if spread >= 0.005
        else f"{len(steps)} ranks: step {med:.1f} ms on every rank (spread under 0.5%)"
    )
    if outliers:
        shown = ", ".join(f"{r} ({steps[r] - med:+.1f} ms)" for r in outliers[:5])
        line += f"; outliers: {shown}" + (f" and {len(outliers) - 5} more" if len(outliers) > 5 else "")
    notes.append(line)
    return notes


__all__ = ["cross_rank", "summarize_ranks"]
