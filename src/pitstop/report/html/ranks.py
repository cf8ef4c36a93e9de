"""HTML pictures of a multi-rank run with timed collectives: where each rank's step goes (data, its own
compute, waiting for peers, communicating) and when each rank arrives at collectives. Reads the JSON
document's ``ranks[]`` (computed once in pitstop.diagnose.ranks); computes nothing."""

from __future__ import annotations

from typing import Any

from pitstop.report.html import svg


def rank_comm_plots(doc: dict[str, Any]) -> list[str]:
    rows = [r for r in doc.get("ranks", []) if r.get("wait_s") is not None and r.get("step_time_s")]
    if len(rows) < 2:
        return []
    labels = [f"rank {r['rank']}" for r in rows]

    def ms(key: str) -> list[float]:
        return [1000 * (r.get(key) or 0.0) for r in rows]

    data = [1000 * (r.get("data_wait_frac") or 0.0) * r["step_time_s"] for r in rows]
    parts = {
        "data": data,
        "own compute": ms("own_compute_s"),
        "waiting for peers": ms("wait_s"),
        "communicating": ms("comm_s"),
    }
    late = ms("arrival_late_s")
    first = min(late)
    out = [
        svg.stacked_bars(
            "per-rank-split",
            "Where each rank's step goes (ms per step; bar i = rank i)",
            parts,
            "rank",
            "ms per step",
        ),
        svg.hbars(
            "per-rank-arrival",
            "Arrival at collectives after the earliest rank (mean; clocks aligned on collective ends)",
            labels,
            [v - first for v in late],
            "ms after the earliest rank",
            colors=[svg.OKABE_ITO[5]] * len(rows),
        ),
    ]
    return [p for p in out if p]
