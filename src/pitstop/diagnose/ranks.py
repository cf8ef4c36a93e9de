"""Who waits for whom: the ranks' collectives put on one clock, computed once for rules and reports.

Every rank recorded its collectives on its own clock. All ranks leave a collective together (it completes
only once the last rank has contributed), so the offset between two ranks' clocks is the median difference of
their completion times over the collectives they share. On the aligned clock:

- a rank's *arrival* at a collective is when it issued it; the last to arrive is the one the others wait for;
- a rank's time blocked in a collective splits into *waiting for peers* (until the last rank arrived) and
  *communicating* (the rest);
- a collective's transfer time runs from the last arrival (or the end of the previous collective of its group,
  since a group runs its collectives in order) to its completion, which gives the achieved algorithm and bus
  bandwidth with nccl-tests' formulas.

Pure functions of the RunProfile: no torch, no measuring.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from pitstop.core.profile import CollectiveRecord, RankProfile, RunProfile, StepRecord

SMALL_COLLECTIVE_BYTES = (
    65_536  # at most this per call: a metric (a few scalars, a per-class vector), not gradients
)
MIN_SKEW_S = 2e-4  # arrival spreads below this are noise on any clock


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: what each link carries relative to the collective's size."""
    if n <= 1:
        return 0.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0  # broadcast, reduce


@dataclass
class OpBandwidth:
    op: str
    count: int  # collectives of this kind matched across ranks
    bytes_per_step: float
    transfer_s_per_step: float
    algbw_gbps: float | None  # GB/s (1e9 bytes/s)
    busbw_gbps: float | None


@dataclass
class RankComm:
    """One rank's step, split with the other ranks in view. Seconds per step (means over measured steps)."""

    rank: int
    host: str | None
    step_s: float
    data_s: float
    compute_s: float | None  # forward + backward minus time blocked in collectives
    optimizer_s: float | None
    other_s: float | None
    wait_s: float  # blocked waiting for the last rank to arrive
    comm_s: float  # blocked while data moved (exposed communication)
    collectives_per_step: float
    bytes_per_step: float
    late_s: float  # mean arrival after the median rank (aligned clocks)
    last_frac: float  # share of collectives it arrived last at
    clock_offset_s: float
    small_comm_s: float = (
        0.0  # of comm_s, in small collectives the job's code issued outside backward (metrics)
    )


@dataclass
class RanksAnalysis:
    ranks: list[RankComm]
    matched: int  # collectives seen by every reporting rank of their group
    skew_s: float  # median over steps of the largest (last arrival − the other ranks' median arrival)
    straggler: int | None  # the rank the others wait for, by arrival
    straggler_last_frac: float | None  # share of steps it was last at the collective with the largest skew
    persistent: bool  # the same rank holds back at least 3 steps in 4
    last_by_step: dict[int, int] = field(default_factory=dict)  # step -> rank last at its largest skew
    bandwidth: list[OpBandwidth] = field(default_factory=list)
    clock: str = "host"

    @property
    def step_s(self) -> float:
        return statistics.median(r.step_s for r in self.ranks)

    def mean_frac(self, name: str, exclude: int | None = None) -> float:
        rows = [r for r in self.ranks if r.rank != exclude and r.step_s > 0]
        if not rows:
            return 0.0
        return statistics.fmean(getattr(r, name) / r.step_s for r in rows)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _by_key(ranks: list[RankProfile]) -> dict[tuple[str, int], dict[int, CollectiveRecord]]:
    table: dict[tuple[str, int], dict[int, CollectiveRecord]] = defaultdict(dict)
    for r in ranks:
        for c in r.collectives:
            table[(c.group, c.seq)][r.rank] = c
    return table


def clock_offsets(ranks: list[RankProfile]) -> dict[int, float]:
    """Each rank's clock minus the lowest rank's, from shared collective completions (0 when none)."""
    table = _by_key(ranks)
    ref = min(r.rank for r in ranks)
    offsets = {ref: 0.0}
    for r in ranks:
        if r.rank == ref:
            continue
        diffs = [
            row[r.rank].done_t - row[ref].done_t  # type: ignore[operator]
            for row in table.values()
            if r.rank in row and ref in row and row[r.rank].done_t is not None and row[ref].done_t is not None
        ]
        offsets[r.rank] = statistics.median(diffs) if diffs else 0.0
    return offsets


def _consistent(row: dict[int, CollectiveRecord]) -> bool:
    ops = {c.op for c in row.values()}
    return len(ops) == 1


def analyse(profile: RunProfile) -> RanksAnalysis | None:
    """The cross-rank picture, or None when fewer than two ranks recorded collectives."""
    ranks = [r for r in profile.ranks if r.steps and r.collectives]
    if len(ranks) < 2:
        return None
    offsets = clock_offsets(ranks)
    table = _by_key(ranks)
    members = {r.rank for r in ranks}

    def arrival(c: CollectiveRecord, rank: int) -> float:
        return c.issued_t - offsets[rank]

    def done(c: CollectiveRecord, rank: int) -> float | None:
        return None if c.done_t is None else c.done_t - offsets[rank]

    late: dict[int, list[float]] = defaultdict(list)
    last_counts: dict[int, int] = defaultdict(int)
    held: dict[int, float] = defaultdict(float)
    skews: list[float] = []
    by_step: dict[int, tuple[float, int]] = {}
    last_arrival: dict[tuple[str, int], float] = {}
    finished: dict[tuple[str, int], float] = {}
    matched = 0
    for key, row in table.items():
        expected = {int(x) for x in key[0].split(",") if x} & members
        if set(row) != expected or len(row) < 2 or not _consistent(row):
            continue
        matched += 1
        arrivals = {rank: arrival(c, rank) for rank, c in row.items()}
        median = statistics.median(arrivals.values())
        last_rank = max(arrivals, key=lambda k: arrivals[k])
        skew = arrivals[last_rank] - statistics.median(v for k, v in arrivals.items() if k != last_rank)
        skews.append(skew)
        last_arrival[key] = arrivals[last_rank]
        ends = [d for rank, c in row.items() if (d := done(c, rank)) is not None]
        if ends:
            finished[key] = statistics.median(ends)
        for rank, t in arrivals.items():
            late[rank].append(t - median)
        if arrivals[last_rank] - max(v for k, v in arrivals.items() if k != last_rank) > MIN_SKEW_S:
            last_counts[last_rank] += 1
            held[last_rank] += skew
        step = row[last_rank].step
        if skew > by_step.get(step, (-1.0, -1))[0]:
            by_step[step] = (skew, last_rank)
    if not matched:
        return None

    rows = [_rank_row(r, offsets, table, last_arrival, late, last_counts, matched) for r in ranks]
    straggler = max(held, key=lambda k: held[k]) if held else None
    # per step, the collective the others waited longest at says who held that step back; a collective where
    # everyone arrived together (DDP's buffer broadcast behind a slow backward) says nothing
    step_last = [rank for _, rank in by_step.values()]
    share = step_last.count(straggler) / len(step_last) if straggler is not None and step_last else None
    return RanksAnalysis(
        ranks=rows,
        matched=matched,
        skew_s=statistics.median(skew for skew, _ in by_step.values()),
        straggler=straggler,
        straggler_last_frac=share,
        persistent=share is not None and share >= 0.75,
        last_by_step={step: rank for step, (_, rank) in sorted(by_step.items())},
        bandwidth=_bandwidth(table, members, last_arrival, finished, offsets, ranks),
        clock=ranks[0].collectives[0].clock,
    )


def small_and_issued_by_code(c: CollectiveRecord) -> bool:
    """A collective the job's code (or a library on a setting of its) issued outside backward, small enough to
    be a metric or a flag: not the gradient or parameter traffic that overlap, buckets or no_sync change
    (``metric_sync`` names it; ``communication_bound`` leaves its time out)."""
    return c.source == "python" and c.site is not None and c.bytes <= SMALL_COLLECTIVE_BYTES


def _blocked(
    rank: RankProfile,
    steps: list[StepRecord],
    offsets: dict[int, float],
    table: dict[tuple[str, int], dict[int, CollectiveRecord]],
    last_arrival: dict[tuple[str, int], float],
    only: Callable[[CollectiveRecord], bool] | None = None,
) -> tuple[float, float]:
    """(waiting, communicating) seconds over the window: blocking calls, plus for asynchronous ones the span
    from the step's last asynchronous issue to the latest completion (DDP's wait at the end of backward);
    ``only``: of the collectives it selects."""
    wait = comm = 0.0
    off = offsets[rank.rank]
    by_step: dict[int, list[CollectiveRecord]] = defaultdict(list)
    for c in rank.collectives:
        if only is None or only(c):
            by_step[c.step].append(c)
    for step in steps:
        calls = by_step.get(step.index, [])
        spans: list[tuple[float, float, tuple[str, int]]] = []
        for c in calls:
            if c.blocked_s is not None and c.clock == "host":
                spans.append((c.issued_t - off, c.issued_t - off + c.blocked_s, (c.group, c.seq)))
            elif c.blocked_s is not None and c.done_t is not None:
                spans.append((c.issued_t - off, c.done_t - off, (c.group, c.seq)))
        pending = [c for c in calls if c.blocked_s is None and c.done_t is not None]
        if pending:
            start = max(c.issued_t for c in pending) - off
            tail = max(pending, key=lambda c: c.done_t or 0.0)
            end = (tail.done_t or 0.0) - off
            if end > start:
                spans.append((start, end, (tail.group, tail.seq)))
        for start, end, key in spans:
            length = max(0.0, end - start)
            waited = min(max(0.0, last_arrival.get(key, start) - start), length)
            wait += waited
            comm += length - waited
    return wait, comm


def _rank_row(
    rank: RankProfile,
    offsets: dict[int, float],
    table: dict[tuple[str, int], dict[int, CollectiveRecord]],
    last_arrival: dict[tuple[str, int], float],
    late: dict[int, list[float]],
    last_counts: dict[int, int],
    matched: int,
) -> RankComm:
    steps = rank.steps
    n = len(steps)
    wait, comm = _blocked(rank, steps, offsets, table, last_arrival)
    small = _blocked(rank, steps, offsets, table, last_arrival, only=small_and_issued_by_code)[1]
    blocked = wait + comm
    fwd_bwd = rank.total("forward_s"), rank.total("backward_s")
    opt = rank.total("optimizer_s")
    compute = None
    other = None
    if fwd_bwd[0] is not None and fwd_bwd[1] is not None:
        compute = fwd_bwd[0] + fwd_bwd[1] - blocked
        if compute < 0 and opt is not None:  # blocked in the optimizer (sharded optimizers' collectives)
            opt, compute = max(0.0, opt + compute), 0.0
        compute = max(0.0, compute)
        if opt is not None:
            other = max(0.0, rank.wall_s - rank.total("data_wait_s") - compute - opt - blocked)  # type: ignore[operator]
    return RankComm(
        rank=rank.rank,
        host=rank.hostname,
        step_s=rank.wall_s / n,
        data_s=(rank.total("data_wait_s") or 0.0) / n,
        compute_s=None if compute is None else compute / n,
        optimizer_s=None if opt is None else opt / n,
        other_s=None if other is None else other / n,
        wait_s=wait / n,
        comm_s=comm / n,
        small_comm_s=small / n,
        collectives_per_step=len(rank.collectives) / n,
        bytes_per_step=sum(c.bytes for c in rank.collectives) / n,
        late_s=statistics.fmean(late[rank.rank]) if late[rank.rank] else 0.0,
        last_frac=last_counts[rank.rank] / matched,
        clock_offset_s=offsets[rank.rank],
    )


def _bandwidth(
    table: dict[tuple[str, int], dict[int, CollectiveRecord]],
    members: set[int],
    last_arrival: dict[tuple[str, int], float],
    finished: dict[tuple[str, int], float],
    offsets: dict[int, float],
    ranks: list[RankProfile],
) -> list[OpBandwidth]:
    steps = statistics.median(len(r.steps) for r in ranks)
    per_op: dict[str, list[tuple[int, float, int]]] = defaultdict(list)
    previous_end: dict[str, float] = {}
    for key in sorted(finished, key=lambda k: (k[0], k[1])):
        row = table[key]
        sample = next(iter(row.values()))
        start = max(last_arrival[key], previous_end.get(key[0], float("-inf")))
        end = finished[key]
        previous_end[key[0]] = end
        if sample.bytes > 0:  # a collective done before it could start (clock noise) moves bytes in 0 s
            per_op[sample.op].append((sample.bytes, max(0.0, end - start), sample.size))
    out = []
    for op, rows in sorted(per_op.items()):
        total_bytes = sum(b for b, _, _ in rows)
        timed = [(b, s) for b, s, _ in rows if s > 0]
        total_s = sum(s for _, s in timed)
        size = max(n for _, _, n in rows)
        algbw = sum(b for b, _ in timed) / total_s / 1e9 if total_s > 0 else None
        out.append(
            OpBandwidth(
                op=op,
                count=len(rows),
                bytes_per_step=total_bytes / steps,
                transfer_s_per_step=total_s / steps,
                algbw_gbps=algbw,
                busbw_gbps=None if algbw is None else algbw * bus_factor(op, size),
            )
        )
    return out


@dataclass
class Scaling:
    """Measured throughput against world size × one rank's throughput, with the loss split into parts."""

    world_size: int
    tokens_per_s: float
    single_rank_tokens_per_s: float
    source: str
    efficiency: float
    lost: dict[str, float]  # shares of the ideal: communication, waiting, data, other

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def scaling(
    profile: RunProfile, analysis: RanksAnalysis | None, tokens_per_s: float | None
) -> Scaling | None:
    """Scaling efficiency of a multi-rank run.

    The one-rank reference is the profile's ``single_rank_tokens_per_s`` when one was given (history or a
    one-rank run, labelled with its source); otherwise it is derived from this run: each rank's step without
    its communication and waiting, i.e. what a rank would do alone at the same per-rank batch (an upper
    bound on one rank's speed, since a lone rank still has its data and compute).
    """
    n = profile.world_size
    if n < 2 or not tokens_per_s:
        return None
    comm = wait = data = 0.0
    if analysis is not None:
        comm = analysis.mean_frac("comm_s")
        wait = analysis.mean_frac("wait_s")
        data_ranks = [r.data_s / r.step_s for r in analysis.ranks if r.step_s]
        data = max(data_ranks) - min(data_ranks) if data_ranks else 0.0
    if profile.single_rank_tokens_per_s:
        single = profile.single_rank_tokens_per_s
        source = profile.single_rank_source or "given"
    elif analysis is not None:
        own = 1.0 - comm - wait
        if own <= 0:
            return None
        single = tokens_per_s / n / own
        source = "derived from this run: each rank's step without its communication and waiting"
    else:
        return None
    efficiency = tokens_per_s / (n * single)
    loss = max(0.0, 1.0 - efficiency)
    named = {"communication": comm, "waiting": wait, "data": data}
    total_named = sum(named.values())
    scale = min(1.0, loss / total_named) if total_named > 0 else 0.0
    lost = {k: round(v * scale, 4) for k, v in named.items()}
    lost["other"] = round(max(0.0, loss - sum(lost.values())), 4)
    return Scaling(n, tokens_per_s, single, source, efficiency, lost)
