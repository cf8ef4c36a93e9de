"""The terminal's per-rank view of a multi-rank run with timed collectives: where each rank's step goes
(data, compute, waiting for peers, communicating), when it arrives at collectives, and the job's bandwidth
and scaling efficiency. Renders the figures of pitstop.diagnose.ranks; computes nothing.

Host names, GPU names, collective op names, the clock's name and the scaling source come from rank files and
traces: they reach the table as ``Text`` with control characters shown as escapes, never as markup."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from pitstop.diagnose import Diagnosis
from pitstop.diagnose.ranks import RankComm, RanksAnalysis
from pitstop.report.untrusted import as_text, shown

MAX_ROWS = 16  # beyond this, the slowest, the fastest and the straggler; the full table is in JSON and HTML


def _ms(value: float | None) -> str:
    return "unknown" if value is None else f"{value * 1000:,.1f}"


def _share(value: float | None, step: float) -> str:
    return "unknown" if value is None or not step else f"{value / step:.0%}"


def pick_rows(a: RanksAnalysis) -> tuple[list[RankComm], int]:
    """All ranks, or for a large job the 3 slowest, 3 fastest and the straggler (and how many are hidden)."""
    rows = sorted(a.ranks, key=lambda r: r.rank)
    if len(rows) <= MAX_ROWS:
        return rows, 0
    by_step = sorted(rows, key=lambda r: r.step_s)
    keep = {r.rank for r in by_step[:3] + by_step[-3:]}
    if a.straggler is not None:
        keep.add(a.straggler)
    shown = [r for r in rows if r.rank in keep]
    return shown, len(rows) - len(shown)


def table(d: Diagnosis, models: dict[int, str] | None = None) -> Table:
    """``models``: each rank's GPU model, for a job that mixes models (a column of its own); None: no column."""
    a = d.ranks_analysis
    assert a is not None
    t = Table(
        title=as_text(
            f"Per rank (ms per step; clocks aligned on collective ends, {a.clock} clock)", one_line=True
        ),
        title_justify="left",
        show_edge=False,
    )
    for col in ("rank", "node", "step", "data", "compute", "waiting", "comm", "arrives vs median", "last at"):
        t.add_column(col, justify="right")
        if col == "node" and models is not None:
            t.add_column("GPU", justify="left")
    rows, hidden = pick_rows(a)
    for r in rows:
        mark = " ◀" if r.rank == a.straggler and a.persistent else ""
        gpu = [] if models is None else [as_text(models.get(r.rank, "?"), one_line=True)]
        t.add_row(
            f"{r.rank}{mark}",
            as_text(r.host or "?", one_line=True),
            *gpu,
            _ms(r.step_s),
            f"{_ms(r.data_s)} ({_share(r.data_s, r.step_s)})",
            f"{_ms(r.compute_s)} ({_share(r.compute_s, r.step_s)})",
            f"{_ms(r.wait_s)} ({_share(r.wait_s, r.step_s)})",
            f"{_ms(r.comm_s)} ({_share(r.comm_s, r.step_s)})",
            f"{r.late_s * 1000:+,.1f}",
            f"{r.last_frac:.0%}",
        )
    lines = []
    if hidden:
        spread = max(r.step_s for r in a.ranks) - min(r.step_s for r in a.ranks)
        lines.append(
            f"+{hidden} more ranks (step spread {spread * 1000:,.1f} ms): the full table is in --json / --html"
        )
    for b in a.bandwidth:
        if b.bytes_per_step < 100_000:
            continue  # a few buffers: latency, not bandwidth (still in the JSON)
        bw = (
            "unknown"
            if b.busbw_gbps is None
            else f"{b.busbw_gbps:,.2f} GB/s bus ({b.algbw_gbps:,.2f} GB/s algorithm)"
        )
        lines.append(f"{shown(b.op, one_line=True)}: {b.bytes_per_step / 1e6:,.1f} MB per step, {bw}")
    s = d.scaling
    if s is not None:
        lost = ", ".join(f"{shown(k, one_line=True)} {v:.0%}" for k, v in s.lost.items() if v >= 0.005)
        lines.append(
            f"scaling efficiency {s.efficiency:.0%} of {s.world_size}× one rank's {s.single_rank_tokens_per_s:,.0f} "
            f"tokens/s ({shown(s.source, one_line=True)})" + (f"; lost to {lost}" if lost else "")
        )
    if d.profile.missing_ranks:
        lines.append(f"missing: ranks {', '.join(map(str, d.profile.missing_ranks))} did not report")
    t.caption = Text("\n".join(lines))  # Text: an op name or source is never read as markup
    t.caption_justify = "left"
    return t
