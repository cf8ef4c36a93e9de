"""Sections for a run (``pitstop.run/1``, from doctor, analyze or a callback)."""

from __future__ import annotations

import json
from html import escape
from itertools import accumulate
from typing import Any

from pitstop.report.html import svg
from pitstop.report.html.page import num, section, snippet, stat, table

PHASES = (
    ("data_wait_s", "data wait"),
    ("forward_s", "forward"),
    ("backward_s", "backward"),
    ("optimizer_s", "optimizer"),
)


def verdict(doc: dict[str, Any]) -> str:
    m, env = doc.get("metrics", {}), doc.get("environment", {})
    stats = [stat(num(m.get("real_tokens_per_s")), "real tokens/s (measured)")]
    if m.get("tokens_per_s") is not None:
        stats.append(stat(num(m.get("tokens_per_s")), "tokens/s incl. padding"))
    if m.get("step_time_s") is not None:
        stats.append(stat(f"{m['step_time_s']:.3f} s", "per optimizer step (median)"))
    if m.get("mfu") is not None:
        stats.append(
            stat(f"{m['mfu']:.0%}", f"MFU on {m.get('gpu') or 'this GPU'} ({m.get('compute_dtype') or '?'})")
        )
    expected = m.get("expected_tokens_per_s")
    if expected:
        stats.append(
            stat(f"{expected[0]:,.0f}–{expected[1]:,.0f}", "tokens/s this GPU should do for this model")
        )
    if m.get("padding_frac") is not None:
        stats.append(stat(f"{m['padding_frac']:.0%}", "of tokens are padding"))
    if m.get("gpu_util") is not None:
        stats.append(stat(f"{m['gpu_util']:.0%}", f"GPU busy ({m.get('source_of_util') or 'measured'})"))
    top = doc.get("findings", [])[:3]
    lines = "".join(
        f"<li><b>{escape(f['title'])}</b> — {escape(f.get('severity', ''))}"
        + (f", est. ×{f['est_speedup']:.2f}" if f.get("est_speedup") else "")
        + "</li>"
        for f in top
    )
    where = (
        f"{env.get('framework') or 'a run'} on {env.get('gpu_name') or env.get('device') or 'unknown device'}"
    )
    body = f'<p class="meta">{escape(where)}</p><div class="verdict">{"".join(stats)}</div>'
    body += (
        f"<h3 style='margin-top:14px'>Top findings</h3><ol>{lines}</ol>"
        if top
        else "<p>No finding: this run looks well tuned.</p>"
    )
    return section("verdict", "Verdict", body)


def findings(doc: dict[str, Any]) -> str:
    framework = doc.get("environment", {}).get("framework") or "pytorch"
    cards = []
    for f in doc.get("findings", []):
        fix = f.get("fix") or {}
        snippets = fix.get("snippets") or {}
        code = snippets.get(framework) or fix.get("snippet") or next(iter(snippets.values()), "")
        meta = [f"confidence {f.get('confidence', 0):.0%}"]
        if f.get("est_speedup"):
            meta.insert(0, f"est. ×{f['est_speedup']:.2f}")
        evidence = json.dumps(f.get("evidence", {}), indent=1, default=str)
        cards.append(
            f'<div class="finding {escape(f.get("severity", ""))}" data-cause="{escape(f["cause"])}">'
            f'<h3><span class="badge">{escape(f.get("severity", ""))}</span>{escape(f["title"])} '
            f'<code>{escape(f["cause"])}</code></h3><p class="meta">{escape(" · ".join(meta))}'
            f"{(' — ' + escape(f['speedup_basis'])) if f.get('speedup_basis') else ''}</p>"
            f"<p>{escape(f.get('summary', ''))}</p>"
            f"<p><b>Fix:</b> {escape(fix.get('text', ''))}</p>"
            + (snippet(code) if code else "")
            + f'<details class="evidence"><summary>evidence</summary><pre>{escape(evidence)}</pre></details></div>'
        )
    return section("findings", "Findings, ranked by estimated time saved", "".join(cards) or "<p>None.</p>")


def _ranks(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list((doc.get("profile") or {}).get("ranks") or [])


def step_plots(doc: dict[str, Any]) -> list[str]:
    ranks = [r for r in _ranks(doc) if r.get("steps")]
    if not ranks:
        return []
    rank = max(ranks, key=lambda r: sum(s["wall_s"] for s in r["steps"]))  # the slowest paces the job
    steps = rank["steps"]
    first = rank.get("warmup_steps", 0) + 1
    series: dict[str, list[float]] = {label: [s.get(key) or 0.0 for s in steps] for key, label in PHASES}
    series["other"] = [max(s["wall_s"] - sum(s.get(k) or 0.0 for k, _ in PHASES), 0.0) for s in steps]
    who = f" (rank {rank['rank']}, the slowest)" if len(ranks) > 1 else ""
    x = [first + i for i in range(len(steps))]
    rate: dict[str, tuple[list[float], list[float]]] = {}
    for key, label in (("tokens", "all tokens (with padding)"), ("real_tokens", "real tokens")):
        if all(s.get(key) is not None for s in steps):
            rate[label] = (x, [s[key] / s["wall_s"] if s["wall_s"] else 0.0 for s in steps])
    tokens_plot = (
        [svg.lines("tokens-per-step", "Tokens per second, step by step", rate, "optimizer step", "tokens/s")]
        if rate
        else []
    )
    if not any(any(series[label]) for _, label in PHASES):
        return tokens_plot  # only wall times (a trace, a log): a breakdown would be one colour
    out = [
        svg.stacked_bars(
            "step-breakdown",
            f"Where each step's time goes{who}",
            {k: [v * 1000 for v in vs] for k, vs in series.items()},
            "optimizer step",
            "time per step (ms)",
            first_x=first,
        )
    ]
    means = {k: sum(v) / len(v) * 1000 for k, v in series.items() if any(v)}
    out.append(
        svg.hbars(
            "step-breakdown-mean",
            "Average step, by phase",
            list(means),
            list(means.values()),
            "milliseconds per step",
            colors=[svg.OKABE_ITO[i % 8] for i in range(len(means))],
        )
    )
    return out + tokens_plot


def gpu_plots(doc: dict[str, Any]) -> list[str]:
    ranks = [r for r in _ranks(doc) if r.get("gpu_samples")]
    if not ranks:
        return []
    rank = ranks[0]
    samples = rank["gpu_samples"]
    start = rank.get("window_start_t")
    start = samples[0]["t"] if start is None else start
    bounds = [start + t for t in accumulate(s["wall_s"] for s in rank.get("steps", []))]
    t = [s["t"] - start for s in samples]
    marks = [b - start for b in bounds]
    out = []
    use: dict[str, tuple[list[float], list[float]]] = {}
    if all(s.get("util") is not None for s in samples):
        use["GPU utilization (%)"] = (t, [s["util"] for s in samples])
    if all(s.get("mem_used") is not None and s.get("mem_total") for s in samples):
        use["memory used (%)"] = (t, [100 * s["mem_used"] / s["mem_total"] for s in samples])
    if use:
        out.append(
            svg.lines(
                "gpu-timeline",
                f"GPU {rank['rank']} over the window",
                use,
                "seconds since the window began",
                "percent",
                marks,
                100,
            )
        )
    pcie: dict[str, tuple[list[float], list[float]]] = {}
    for key, label in (("pcie_rx", "PCIe host → GPU (MB/s)"), ("pcie_tx", "PCIe GPU → host (MB/s)")):
        if all(s.get(key) is not None for s in samples):
            pcie[label] = (t, [s[key] / 1e6 for s in samples])
    if pcie:
        out.append(
            svg.lines("pcie-timeline", "PCIe traffic", pcie, "seconds since the window began", "MB/s", marks)
        )
    return out


def rank_plots(doc: dict[str, Any]) -> list[str]:
    per_rank = [r for r in doc.get("ranks", []) if r.get("step_time_s") is not None]
    if len(per_rank) < 2:
        return []
    labels = [f"rank {r['rank']}" for r in per_rank]
    out = [
        svg.hbars(
            "per-rank-step",
            "Step time per rank",
            labels,
            [r["step_time_s"] * 1000 for r in per_rank],
            "ms per step",
        )
    ]
    if all(r.get("data_wait_frac") is not None for r in per_rank):
        out.append(
            svg.hbars(
                "per-rank-data-wait",
                "Share of the step spent waiting for data, per rank",
                labels,
                [100 * r["data_wait_frac"] for r in per_rank],
                "percent of step time",
                colors=[svg.OKABE_ITO[1]] * len(per_rank),
            )
        )
    return out


def trace_plots(doc: dict[str, Any]) -> list[str]:
    traces = [r["trace"] for r in _ranks(doc) if r.get("trace")]
    if not traces:
        return []
    out = []
    cats: dict[str, float] = {}
    for tr in traces:
        for k, v in (tr.get("breakdown_ms") or {}).items():
            cats[k] = cats.get(k, 0.0) + v / len(traces)
    if cats:
        names = sorted(cats, key=lambda k: -cats[k])
        out.append(
            svg.hbars(
                "trace-categories",
                f"Step time by category (profiler trace{'s, mean of ' + str(len(traces)) + ' ranks' if len(traces) > 1 else ''})",
                names,
                [cats[k] for k in names],
                "ms per step",
                colors=[svg.OKABE_ITO[i % 8] for i in range(len(names))],
            )
        )
    for key, title in (
        ("temporal", "GPU time: compute, non-compute, idle"),
        ("idle_split", "Why the GPU sat idle"),
    ):
        shares: dict[str, float] = {}
        for tr in traces:
            for k, v in (tr.get(key) or {}).items():
                shares[k] = shares.get(k, 0.0) + 100 * v / len(traces)
        if shares:
            out.append(
                svg.hbars(
                    f"trace-{key.replace('_', '-')}",
                    title,
                    list(shares),
                    list(shares.values()),
                    "percent",
                    colors=[svg.OKABE_ITO[(i + 2) % 8] for i in range(len(shares))],
                )
            )
    if len(traces) > 1 and all(tr.get("step_ms") for tr in traces):
        out.append(
            svg.hbars(
                "trace-per-rank",
                "Step time per rank (traces)",
                [f"rank {r['rank']}" for r in _ranks(doc) if r.get("trace")],
                [tr["step_ms"] for tr in traces],
                "ms per step",
            )
        )
    return out


def environment(doc: dict[str, Any]) -> str:
    env = doc.get("environment", {})
    rows = []
    for key in (
        "device", "gpu_name", "gpu_count", "world_size", "framework", "attn_implementation", "param_dtype",
        "autocast_dtype", "tf32", "gradient_checkpointing", "micro_batch_size", "grad_accum_steps", "zero_stage",
        "offload",
    ):  # fmt: skip
        if env.get(key) is not None:
            rows.append([escape(key), escape(str(env[key]))])
    model = env.get("model") or {}
    if model.get("model_type"):
        params = model.get("params_total")
        rows.append(
            ["model", escape(f"{model['model_type']}" + (f", {params:,} parameters" if params else ""))]
        )
    loader = env.get("dataloader") or {}
    if loader:
        shown = {k: v for k, v in loader.items() if v is not None}
        rows.append(["DataLoader", escape(", ".join(f"{k}={v}" for k, v in shown.items()))])
    for lib, version in (env.get("versions") or {}).items():
        rows.append([escape(lib), escape(str(version))])
    if doc.get("command"):
        rows.append(["command", f"<code>{escape(' '.join(doc['command']))}</code>"])
    return section("environment", "What pitstop saw", table(["", ""], rows) if rows else "")


def run_sections(doc: dict[str, Any]) -> list[str]:
    from pitstop.report.html.ranks import rank_comm_plots

    plots = step_plots(doc) + gpu_plots(doc) + rank_plots(doc) + rank_comm_plots(doc) + trace_plots(doc)
    return [verdict(doc), findings(doc), section("plots", "Pictures", "".join(plots)), environment(doc)]
