"""The page around the sections: inline CSS (system fonts, print rules) and one small inline script for the
copy buttons. Nothing is fetched: the file opens offline and from an e-mail attachment."""

from __future__ import annotations

from html import escape

CSS = """
:root { --fg:#1d1d1f; --muted:#5f6368; --line:#e3e3e6; --card:#fafafb; --accent:#0072B2; }
* { box-sizing:border-box; }
body { font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
       color:var(--fg); margin:0 auto; max-width:980px; padding:24px 20px 60px; }
h1 { font-size:24px; margin:0 0 4px; } h2 { font-size:19px; margin:32px 0 10px; border-bottom:1px solid var(--line); }
h3 { font-size:16px; margin:0; }
.sub { color:var(--muted); margin:0 0 18px; }
.verdict { display:grid; grid-template-columns:repeat(auto-fit,minmax(190px,1fr)); gap:10px; }
.stat { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:10px 12px; }
.stat b { display:block; font-size:22px; } .stat span { color:var(--muted); font-size:13px; }
.finding { border:1px solid var(--line); border-left:5px solid #999; border-radius:8px; padding:12px 14px; margin:10px 0; }
.finding.high { border-left-color:#D55E00; } .finding.medium { border-left-color:#E69F00; } .finding.low { border-left-color:#56B4E9; }
.badge { font-size:12px; font-weight:600; padding:1px 7px; border-radius:9px; background:#eee; margin-right:6px; text-transform:uppercase; }
.meta { color:var(--muted); font-size:13px; margin:2px 0 6px; }
pre { background:#f4f4f6; border-radius:6px; padding:10px 12px; overflow-x:auto; font-size:13px; white-space:pre-wrap; margin:0; }
.snippet { position:relative; margin-top:8px; }
button.copy { position:absolute; top:6px; right:6px; font-size:12px; border:1px solid var(--line); background:#fff; border-radius:5px; padding:2px 8px; cursor:pointer; }
table { border-collapse:collapse; width:100%; font-size:14px; }
th, td { text-align:left; padding:5px 8px; border-bottom:1px solid var(--line); vertical-align:top; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; }
.kept { color:#009E73; font-weight:600; } .rejected { color:#D55E00; }
figure.plot { margin:14px 0 22px; } figcaption { font-weight:600; margin-bottom:4px; }
svg { width:100%; height:auto; display:block; }
svg .grid { stroke:#ececf0; } svg .tick { font-size:11px; fill:#5f6368; } svg .axis-label { font-size:12px; fill:#333; }
svg .marker { stroke:#d5d5d9; stroke-width:0.6; } svg .whisker { stroke:#222; stroke-width:1.2; fill:none; }
svg .reference { stroke:#333; stroke-dasharray:4 3; } svg .value { font-size:11px; fill:#333; }
.legend { display:flex; flex-wrap:wrap; gap:12px; font-size:12px; color:var(--muted); }
.key i { display:inline-block; width:10px; height:10px; border-radius:2px; margin-right:5px; vertical-align:-1px; }
details summary { cursor:pointer; color:var(--muted); }
.evidence { font-size:13px; color:var(--muted); }
footer { margin-top:40px; color:var(--muted); font-size:12px; }
@media print { body { max-width:none; padding:0; } button.copy { display:none; } .finding, figure.plot { break-inside:avoid; } }
"""

SCRIPT = """
document.addEventListener('click', function (event) {
  var button = event.target.closest('button.copy');
  if (!button) return;
  var text = button.parentElement.querySelector('pre').innerText;
  function done() { button.textContent = 'Copied'; setTimeout(function () { button.textContent = 'Copy'; }, 1500); }
  function fallback() {
    var area = document.createElement('textarea'); area.value = text; document.body.appendChild(area);
    area.select(); try { document.execCommand('copy'); done(); } catch (e) { button.textContent = 'Select and copy'; }
    document.body.removeChild(area);
  }
  if (navigator.clipboard && window.isSecureContext) { navigator.clipboard.writeText(text).then(done, fallback); }
  else { fallback(); }
});
"""


def page(title: str, subtitle: str, sections: list[str], footer: str) -> str:
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
        f'<header><h1>{escape(title)}</h1><p class="sub">{escape(subtitle)}</p></header>'
        + "".join(s for s in sections if s)
        + f"<footer>{escape(footer)}</footer><script>{SCRIPT}</script></body></html>\n"
    )


def section(key: str, title: str, body: str) -> str:
    if not body:
        return ""
    return (
        f'<section id="{escape(key)}" data-section="{escape(key)}"><h2>{escape(title)}</h2>{body}</section>'
    )


def stat(value: str, label: str) -> str:
    return f'<div class="stat"><b>{escape(value)}</b><span>{escape(label)}</span></div>'


def snippet(code: str) -> str:
    return f'<div class="snippet"><button class="copy" type="button">Copy</button><pre>{escape(code)}</pre></div>'


def table(head: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:  # type: ignore[assignment]
    """``rows`` hold HTML already escaped by the caller."""
    th = "".join(f'<th class="{"num" if i in numeric else ""}">{escape(h)}</th>' for i, h in enumerate(head))
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{"num" if i in numeric else ""}">{c}</td>' for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def num(v: float | None, fmt: str = ",.0f", unknown: str = "unknown") -> str:
    return unknown if v is None else format(v, fmt)
