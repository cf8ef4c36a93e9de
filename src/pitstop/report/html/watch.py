"""The whole-run section of a watched run's report: the timeline of its windows (tokens/s and the step's parts,
with changes and periodic stalls marked), the changes, the stalls and the findings per phase. Draws the
document's ``watch`` section only."""

from __future__ import annotations

from html import escape
from typing import Any

from pitstop.core.vocabulary import Phase
from pitstop.report.html import svg
from pitstop.report.html.page import num, section, table


def watch_section(w: dict[str, Any]) -> str:
    windows = w.get("windows") or []
    ends = [float(x["last_step"]) for x in windows]
    marks = [float(c["step"]) for c in w.get("changes", [])]
    rate = {
        label: (ends, [float(x.get(key) or 0.0) for x in windows])
        for key, label in (("tokens_per_s", "tokens/s"), ("real_tokens_per_s", "real tokens/s"))
        if windows and all(x.get(key) is not None for x in windows)
    }
    plots = [
        svg.lines(
            "watch-rate",
            "Tokens per second, window by window (changes marked)",
            rate,
            "optimizer step (window end)",
            "tokens/s",
            markers=marks,
            marker_label="change",
            integer_x=True,
        )
    ]
    generating = any((x.get("parts") or {}).get(Phase.GENERATE) for x in windows)  # an RL trainer's rollouts
    parts = {
        phase.window_label: [1000 * float((x.get("parts") or {}).get(phase, 0.0)) for x in windows]
        for phase in Phase.breakdown(generation=generating)
    }
    if windows:
        plots.append(
            svg.stacked_bars(
                "watch-breakdown",
                "Where a step's time goes, window by window (mean per step)",
                parts,
                "window",
                "ms per step",
                first_x=1,
            )
        )
    rows = [[f"{c['step']:,}", escape(c["kind"]), escape(c["text"])] for c in w.get("changes", [])]
    changes = (
        table(["from step", "change", "what changed"], rows)
        if rows
        else "<p>No change: steady throughout.</p>"
    )
    stall_html, phases = _stalls_and_phases(w)
    head = (
        f"<p>{w.get('steps', 0):,} steps in {w.get('seconds', 0):,.0f} s, {len(windows)} windows of "
        f"{(w.get('window') or {}).get('steps')} steps.</p>"
    )
    body = (
        head
        + "".join(p for p in plots if p)
        + "<h3>Changes</h3>"
        + changes
        + "<h3>Periodic stalls</h3>"
        + stall_html
        + "<h3>Findings per phase</h3>"
        + table(["steps", "tokens/s", "findings (share of step time a fix would save)"], phases)
    )
    return section("watch", "The whole run", body)


def _stalls_and_phases(w: dict[str, Any]) -> tuple[str, list[list[str]]]:
    """The periodic stalls' table and the rows of the findings per phase."""
    stalls = [
        [
            str(s["period"]),
            f"{s['first_step']:,}",
            str(s["count"]),
            num(s["mean_excess_s"], ".2f"),
            escape(s["text"]),
        ]
        for s in w.get("periodic_stalls", [])
    ]
    stall_html = (
        table(["every (steps)", "first", "times", "extra s each", "what"], stalls, numeric={0, 1, 2, 3})
        if stalls
        else "<p>No periodic stall.</p>"
    )
    phases = [
        [
            f"{p['first_step']:,}–{p['last_step']:,}",
            num(p.get("tokens_per_s")),
            escape(
                ", ".join(f"{c} ({v:.0%})" for c, v in sorted(p["findings"].items(), key=lambda kv: -kv[1]))
            )
            or "none",
        ]
        for p in w.get("phases", [])
    ]
    return stall_html, phases
