"""Sections for stored history runs (``pitstop history list --json`` or ``compare --json``)."""

from __future__ import annotations

from html import escape
from typing import Any

from pitstop.report.html import svg
from pitstop.report.html.page import num, section, table


def history_sections(runs: list[dict[str, Any]]) -> list[str]:
    runs = sorted(runs, key=lambda r: r["id"])
    measured = [r for r in runs if r.get("real_tokens_per_s") is not None]
    plots = []
    if measured:
        by_setup: dict[str, tuple[list[float], list[float]]] = {}
        for r in measured:
            xs, ys = by_setup.setdefault(f"setup {r.get('fingerprint') or '?'}", ([], []))
            xs.append(float(r["id"]) if isinstance(r["id"], int | float) else float(len(xs)))
            ys.append(r["real_tokens_per_s"])
        if max(len(xs) for xs, _ in by_setup.values()) > 1:
            plots.append(
                svg.lines("history-line", "Real tokens/s over runs", by_setup, "run id", "real tokens/s")
            )
        plots.append(
            svg.hbars(
                "history-bars",
                "Real tokens/s per run",
                [f"#{r['id']} {r.get('kind') or ''} {r.get('label') or ''}".strip() for r in measured],
                [r["real_tokens_per_s"] for r in measured],
                "real tokens/s",
                reference=measured[0]["real_tokens_per_s"],
                reference_label=f"run #{measured[0]['id']}",
            )
        )
    first = measured[0]["real_tokens_per_s"] if measured else None
    rows = [
        [
            escape(str(r["id"])),
            escape(r.get("created_at") or ""),
            escape(r.get("kind") or ""),
            escape(r.get("label") or ""),
            f"<code>{escape(r.get('fingerprint') or '')}</code>",
            num(r.get("real_tokens_per_s"), ",.0f", "–"),
            "–"
            if not first or r.get("real_tokens_per_s") is None
            else f"×{r['real_tokens_per_s'] / first:.2f}",
            num(r.get("mfu"), ".0%", "–"),
        ]
        for r in runs
    ]
    table_html = table(
        ["id", "when", "kind", "label", "setup", "real tokens/s", f"vs #{runs[0]['id']}", "MFU"],
        rows,
        {5, 6, 7},
    )
    return [section("verdict", "Runs", table_html), section("plots", "Pictures", "".join(plots))]
