"""Results in notebooks: the self-contained HTML report inside an isolated frame, so its styles never touch the
notebook's own (and the notebook's never bend the report)."""

from __future__ import annotations

from html import escape
from typing import Any

from pitstop.diagnose import Diagnosis
from pitstop.report.html import render_html

HEIGHT_PX = 720


def notebook_html(result: Any) -> str:
    """A Diagnosis, a TuneResult, or a saved document, as an ``<iframe srcdoc>`` holding its report."""
    doc = result if isinstance(result, Diagnosis | dict) else result.to_dict()
    page = render_html(doc)
    return (
        f'<iframe srcdoc="{escape(page, quote=True)}" title="pitstop report" '
        f'style="width:100%;height:{HEIGHT_PX}px;border:1px solid #ddd;border-radius:4px"></iframe>'
    )
