"""Sections for a tune result (``pitstop.tune/1``)."""

from __future__ import annotations

from html import escape
from typing import Any

from pitstop.diagnose.document import read_run
from pitstop.report.html import svg
from pitstop.report.html.page import num, section, snippet, stat, table
from pitstop.report.html.run import environment

KEPT, REJECTED, BASE = svg.OKABE_ITO[2], svg.OKABE_ITO[5], svg.OKABE_ITO[7]


def tune_sections(doc: dict[str, Any]) -> list[str]:
    base = doc["baseline"]
    best = doc.get("best")
    stats = [stat(num(base["real_tokens_per_s"]), "real tokens/s before (baseline)")]
    if best:
        stats += [
            stat(num(best["real_tokens_per_s"]), "real tokens/s with the kept fixes"),
            stat(f"×{best['speedup']:.2f}", "speed-up, measured on your job"),
            stat(" + ".join(best["fixes"]), "fixes kept"),
        ]
    else:
        stats.append(stat("none", "no fix measurably helped"))
    if base.get("drift") is not None:
        stats.append(stat(f"{base['drift']:+.1%}", "baseline drift, start to end"))
    verdict = section("verdict", "Verdict", f'<div class="verdict">{"".join(stats)}</div>')

    measured = [c for c in doc["candidates"] if c.get("real_tokens_per_s") is not None]
    labels = ["baseline"] + [c["fix"] for c in measured]
    values = [base["real_tokens_per_s"]] + [c["real_tokens_per_s"] for c in measured]
    errors: list[float | None] = [base["real_tokens_per_s"] * (base.get("spread") or 0.0)]
    errors += [c["real_tokens_per_s"] * (c.get("window_spread") or 0.0) for c in measured]
    colors = [BASE] + [KEPT if c["kept"] else REJECTED for c in measured]
    if best and len(best["fixes"]) > 1:
        labels.append(" + ".join(best["fixes"]))
        values.append(best["real_tokens_per_s"])
        errors.append(None)
        colors.append(KEPT)
    bars = svg.hbars(
        "tune-bars",
        "Real tokens/s per trial, with ± its uncertainty (green: kept, red: rejected)",
        labels,
        values,
        "real tokens/s",
        errors=errors,
        colors=colors,
        reference=base["real_tokens_per_s"],
        reference_label="baseline",
    )
    rows = []
    for c in doc["candidates"]:
        speed = "–" if c.get("speedup") is None else f"×{c['speedup']:.2f} ±{(c.get('spread') or 0):.0%}"
        verdict_cell = (
            '<span class="kept">kept</span>'
            if c["kept"]
            else f'<span class="rejected">{escape(c.get("status") or "rejected")}</span>'
        )
        rows.append(
            [
                f"<b>{escape(c['fix'])}</b><br><span class='meta'>{escape(c.get('title', ''))}</span>",
                "preserved" if c["preserves_computation"] else "changed",
                num(c.get("real_tokens_per_s"), ",.0f", "–"),
                speed,
                verdict_cell + f"<br><span class='meta'>{escape(c.get('reason', ''))}</span>",
            ]
        )
    for item in doc.get("not_tried", []):
        rows.append([escape(item["fix"]), "", "–", "–", f"not tried: {escape(item['reason'])}"])
    trials = section(
        "trials",
        "Every trial",
        bars + table(["fix", "computation", "real tokens/s", "speed-up", "verdict"], rows, {2, 3}),
    )
    changes = ""
    if best:
        changes = "".join(
            f'<div class="finding low"><h3>{escape(c["fix"])}</h3><p>{escape(c["text"])}</p>{snippet(c["snippet"])}</div>'
            for c in best["changes"]
        )
    notes = "".join(f"<li>{escape(n)}</li>" for n in doc.get("notes", []))
    body = changes + (f"<h3>Notes</h3><ul>{notes}</ul>" if notes else "")
    out = [verdict, trials, section("changes", "The changes to make", body)]
    if doc.get("baseline_run"):
        out.append(environment(read_run(doc["baseline_run"])))
    return out
