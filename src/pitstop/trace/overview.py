"""The step-time breakdown of the PyTorch profiler's TensorBoard plugin ("Overview"), recomputed.

Same categories and semantics, so the numbers can be compared with what users see there:

* roles: Kernel, Memcpy, Memset, Communication (kernels launched under an ``nccl:*`` / ``gloo:*`` operator,
  plus those operators' CPU time), Runtime (CUDA runtime calls), DataLoader (``enumerate(DataLoader)#...
  .__next__``), CPU Exec (operators and user annotations), Other (the rest of the step);
* each role is the union of its intervals across devices, streams and threads; a moment of a step counts
  for the first role that covers it, in that order;
* steps are the ``ProfilerStep#N`` spans (without them: trace/steps.py's, or the whole trace as one), aligned to the GPU: a step starts where the previous one ended
  and ends no earlier than the last GPU operation its CUDA runtime calls launched; trailing steps without
  GPU work are dropped;
* GPU utilization: per device, the union of its kernels inside [first step start, last step end] over that
  span.

Deliberate differences from plugin 0.4.3, documented in the README: ``cuda_runtime`` events count as
Runtime (0.4.3 predates that category name and would report 0 and skip GPU alignment on current traces;
its main branch maps it), and an overlap is resolved by priority even when one role covers a whole step
(0.4.3 then restarts from the next role unclipped and can exceed 100%).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pitstop.trace.events import TraceColumns
from pitstop.trace.intervals import covers, sorted_unique, union
from pitstop.trace.steps import infer_windows

ROLES = ("Kernel", "Memcpy", "Memset", "Communication", "Runtime", "DataLoader", "CPU Exec")


@dataclass
class Step:
    number: int
    start: float
    end: float
    device_ops: int = 0

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class Overview:
    steps: list[Step]
    role_us: list[dict[str, float]]  # per step, every role and "Other"
    gpu_util: dict[int, float] = field(default_factory=dict)
    aligned: bool = False
    steps_from: str = "ProfilerStep#N spans"  # how the steps were found, in words (trace/steps.py)

    @property
    def mean_step_us(self) -> float:
        return float(np.mean([s.duration for s in self.steps])) if self.steps else 0.0

    def mean_role_us(self) -> dict[str, float]:
        if not self.role_us:
            return {}
        return {role: float(np.mean([r[role] for r in self.role_us])) for role in (*ROLES, "Other")}

    def shares(self) -> dict[str, float]:
        """Each role's mean time as a share of the mean step time (the plugin's percentages / 100)."""
        total = self.mean_step_us
        return {k: (v / total if total else 0.0) for k, v in self.mean_role_us().items()}


def _device_ops(cols: TraceColumns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All device operations (kernels, copies, sets): start, end, correlation."""
    parts = [cols.kernels, cols.memcpy, cols.memset]
    ts = np.concatenate([np.frombuffer(p.ts, dtype=np.float64) for p in parts])
    end = np.concatenate([np.frombuffer(p.end, dtype=np.float64) for p in parts])
    corr = np.concatenate([np.frombuffer(p.correlation, dtype=np.int64) for p in parts])
    return ts, end, corr


def host_steps(cols: TraceColumns) -> list[Step]:
    """ProfilerStep spans in time order; a step number seen twice keeps its first span."""
    seen: set[int] = set()
    steps = []
    for number, start, end in sorted(cols.steps, key=lambda s: s[1]):
        if number in seen:
            continue
        seen.add(number)
        steps.append(Step(number, start, end))
    return steps


def align_steps(cols: TraceColumns, steps: list[Step]) -> tuple[list[Step], bool]:
    """Stretch steps to the GPU work their runtime calls launched (see the module docstring)."""
    if not steps:
        return steps, False
    # views, not copies: a 2 GB trace has millions of runtime calls
    rt_ts = np.frombuffer(cols.runtime.ts, dtype=np.float64)
    rt_end = np.frombuffer(cols.runtime.end, dtype=np.float64)
    rt_corr = np.frombuffer(cols.runtime.correlation, dtype=np.int64)
    hs = np.array([s.start for s in steps])
    he = np.array([s.end for s in steps])
    # a runtime call (not a driver call) belongs to the step whose host window contains it entirely;
    # in place where it can be, and the step numbers narrowed before the sort: at 2 GB of trace each
    # full-length temporary is ~14 MB and this is the analyses' peak
    idx = np.searchsorted(hs, rt_ts, side="right")
    idx -= 1
    inside = idx >= 0
    np.maximum(idx, 0, out=idx)
    inside &= rt_end <= he[idx]
    inside &= np.frombuffer(cols.runtime.driver, dtype=np.int8) == 0
    inside &= rt_corr >= 0
    step_of_call = idx[inside].astype(np.int32)
    del idx
    calls = rt_corr[inside]
    del inside
    # correlation id -> step of the first such call that carries it (sorted arrays, not a dict)
    keys, first = np.unique(calls, return_index=True)
    del calls
    step_of_key = step_of_call[first]
    del step_of_call, first
    dev_ts, dev_end, dev_corr = _device_ops(cols)  # only now: not held with the temporaries above
    n = len(steps)
    dev_min = np.full(n, np.inf)
    dev_max = np.full(n, -np.inf)
    count = np.zeros(n, dtype=np.int64)
    pos = np.minimum(np.searchsorted(keys, dev_corr), max(keys.size - 1, 0))
    matched = (keys[pos] == dev_corr) if keys.size else np.zeros(dev_ts.size, dtype=bool)
    owner = step_of_key[pos[matched]] if keys.size else np.zeros(0, dtype=np.int64)
    np.add.at(count, owner, 1)
    np.minimum.at(dev_min, owner, dev_ts[matched])
    np.maximum.at(dev_max, owner, dev_end[matched])
    if not matched.any():
        return steps, False
    prev_end = steps[0].start
    if count[0] > 0:
        earlier = (~matched) & (dev_end < dev_min[0])
        if earlier.any():
            prev_end = max(prev_end, float(dev_end[earlier].max()))
    aligned = []
    for i, step in enumerate(steps):
        start = max(prev_end, step.start)
        end = max(step.end, start) if count[i] == 0 else max(step.end, float(dev_max[i]), start)
        aligned.append(Step(step.number, start, end, int(count[i])))
        prev_end = end
    last = int(np.nonzero(count)[0].max())
    keep = last + 1
    if last > 0 and count[last - 1] * 0.8 > count[last]:
        keep = last
    return aligned[:keep], True


def _role_intervals(cols: TraceColumns) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    k = cols.kernels
    k_ts, k_end = np.frombuffer(k.ts, dtype=np.float64), np.frombuffer(k.end, dtype=np.float64)
    externals = np.frombuffer(k.external, dtype=np.int64)
    comm_kernel = (
        np.isin(externals, np.fromiter(cols.comm_externals, dtype=np.int64))
        if cols.comm_externals
        else (np.zeros(k_ts.size, dtype=bool))
    )
    rt_mask = np.frombuffer(cols.runtime.driver, dtype=np.int8) == 0

    def cols_of(c: object, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        ts = np.frombuffer(c.ts, dtype=np.float64)  # type: ignore[attr-defined]
        end = np.frombuffer(c.end, dtype=np.float64)  # type: ignore[attr-defined]
        return (ts, end) if mask is None or mask.all() else (ts[mask], end[mask])

    comm_cpu = cols_of(cols.comm_ops)
    return {
        "Kernel": union(k_ts[~comm_kernel], k_end[~comm_kernel]),
        "Memcpy": union(*cols_of(cols.memcpy)),
        "Memset": union(*cols_of(cols.memset)),
        "Communication": union(
            np.concatenate([k_ts[comm_kernel], comm_cpu[0]]),
            np.concatenate([k_end[comm_kernel], comm_cpu[1]]),
        ),
        "Runtime": union(*cols_of(cols.runtime, rt_mask)),
        "DataLoader": union(*cols_of(cols.dataloader)),
        "CPU Exec": union(
            np.concatenate([np.frombuffer(cols.cpu_ops.ts), np.frombuffer(cols.annotations.ts)]),
            np.concatenate([np.frombuffer(cols.cpu_ops.end), np.frombuffer(cols.annotations.end)]),
        ),
    }


def overview(cols: TraceColumns) -> Overview:
    marked, how = host_steps(cols), "ProfilerStep#N spans"
    if not marked:
        windows, how = infer_windows(cols)
        marked = [Step(i, w.start, w.end) for i, w in enumerate(windows)]
    steps, aligned = align_steps(cols, marked)
    if not steps:
        return Overview(steps=[], role_us=[], aligned=False, steps_from=how)
    intervals = _role_intervals(cols)  # once: each call builds every role's union
    roles = [intervals[role] for role in ROLES]
    del intervals
    per_step = np.zeros((len(steps), len(ROLES) + 1))
    for i, step in enumerate(steps):  # step by step: memory follows one step's events, not the trace's
        lo, hi = step.start, step.end
        window = []
        for starts, ends in roles:  # the (sorted, disjoint) intervals that reach into the step
            a, b = np.searchsorted(ends, lo, side="left"), np.searchsorted(starts, hi, side="right")
            window.append((starts[a:b], ends[a:b]))
        points = sorted_unique(np.concatenate([np.array([lo, hi]), *(x for pair in window for x in pair)]))
        points = points[(points >= lo) & (points <= hi)]
        mids = (points[:-1] + points[1:]) / 2
        owner = np.full(mids.size, len(ROLES), dtype=np.int64)  # "Other" unless a role covers the moment
        for r, (starts, ends) in enumerate(window):
            free = owner == len(ROLES)
            hit = covers(starts, ends, mids[free])
            owner[np.nonzero(free)[0][hit]] = r
        np.add.at(per_step[i], owner, np.diff(points))
    lo, hi = steps[0].start, steps[-1].end
    role_us = [dict(zip((*ROLES, "Other"), row.tolist(), strict=True)) for row in per_step]
    return Overview(
        steps=steps, role_us=role_us, gpu_util=_gpu_util(cols, lo, hi), aligned=aligned, steps_from=how
    )


def _gpu_util(cols: TraceColumns, lo: float, hi: float) -> dict[int, float]:
    k = cols.kernels
    ts, end = np.frombuffer(k.ts, dtype=np.float64), np.frombuffer(k.end, dtype=np.float64)
    devices = np.frombuffer(k.device, dtype=np.int64)
    util = {}
    for device in sorted(set(devices.tolist()) - {-1}):
        s, e = union(ts[devices == device], end[devices == device])
        busy = float(np.sum(np.maximum(np.minimum(e, hi) - np.maximum(s, lo), 0.0)))
        util[int(device)] = busy / (hi - lo) if hi > lo else 0.0
    return util
