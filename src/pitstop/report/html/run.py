"""Sections for a run (a Diagnosis: live, or read back from ``pitstop.run/1`` by ``read_run``).

Only draws: every number comes from the Diagnosis's metrics and results (the shown rank's step series,
its GPU window, the per-rank rows), so this page shows what the terminal shows."""

from __future__ import annotations

import json
from dataclasses import asdict
from html import escape

from pitstop.core.findings import Fix
from pitstop.core.profile import RankProfile, TraceStats
from pitstop.core.vocabulary import Phase
from pitstop.diagnose import Diagnosis, failure_line
from pitstop.diagnose.coverage import checked_line, no_finding_line, not_checked_line
from pitstop.diagnose.gpu_models import gpu_models_line, mixed_models_words
from pitstop.report.energy import cost_line, energy_line
from pitstop.report.html import svg
from pitstop.report.html.page import num, section, snippet, stat, table
from pitstop.report.savings import context_line, describe, first_saving


def _where(d: Diagnosis) -> str:
    env = d.profile.environment
    # a mix of GPU models: every model, not the lowest rank's
    device = mixed_models_words(d.profile) or env.gpu_name or env.device or "unknown device"
    return f"{env.framework or 'a run'} on {device}"


def verdict(d: Diagnosis) -> str:
    m = d.metrics
    stats = [stat(num(m.real_tokens_per_s), "real tokens/s (measured)")]
    if m.tokens_per_s is not None:
        stats.append(stat(num(m.tokens_per_s), "tokens/s incl. padding"))
    if m.step_time_s is not None:
        stats.append(stat(f"{m.step_time_s:.3f} s", "per optimizer step (median)"))
    if m.mfu is not None:
        stats.append(stat(f"{m.mfu:.0%}", f"MFU on {m.gpu or 'this GPU'} ({m.compute_dtype or '?'})"))
    if m.expected_tokens_per_s:
        lo, hi = m.expected_tokens_per_s
        stats.append(stat(f"{lo:,.0f}–{hi:,.0f}", "tokens/s this GPU should do for this model"))
    if m.padding_frac is not None:
        stats.append(stat(f"{m.padding_frac:.0%}", "of tokens are padding"))
    if m.gpu_util is not None:
        stats.append(stat(f"{m.gpu_util:.0%}", f"GPU busy ({m.source_of_util or 'measured'})"))
    if (
        m.gpu_util_active is not None
        and m.gpu_util is not None
        and abs(m.gpu_util_active - m.gpu_util) >= 0.005
    ):
        stats.append(stat(f"{m.gpu_util_active:.0%}", "GPU busy while the job computed"))
    top = d.findings[:3]
    lines = "".join(
        f"<li><b>{escape(f.title)}</b> — {escape(f.severity)}"
        + (f", est. ×{f.est_speedup:.2f}" if f.est_speedup else "")
        + (f", saves {escape(describe(f.saving))}" if f.saving else "")
        + "</li>"
        for f in top
    )
    body = f'<p class="meta">{escape(_where(d))}</p><div class="verdict">{"".join(stats)}</div>'
    failed = failure_line(d.profile)
    if failed is not None:  # a crashed job: its exit and exception lead, as in the terminal
        lead = f'<p class="failure" data-figure="failure" style="color:#b00020"><b>{escape(failed)}</b></p>'
        body = lead + body
    for label, line in (("Energy", energy_line(m)), ("Cost", cost_line(d.cost))):
        if line is not None:  # only where measured (a GPU's power) or priced, as the terminal says it
            body += f'<p class="meta" data-figure="{label.lower()}"><b>{label}:</b> {escape(line)}</p>'
    saving = first_saving(d.findings)
    if saving is not None:
        body += f'<p class="meta">{escape(context_line(saving))}</p>'
    coverage = d.coverage  # what was checked and on what, as the terminal says it
    body += (
        f"<h3 style='margin-top:14px'>Top findings</h3><ol>{lines}</ol>"
        if top
        else '<p data-figure="no-finding"'
        + ("" if coverage.clean else ' style="color:#8a5a00"')
        + f">{escape(no_finding_line(coverage))}</p>"
    )
    body += f'<p class="meta" data-figure="checked"><b>Checked:</b> {escape(checked_line(coverage))}</p>'
    missing = not_checked_line(coverage)
    if missing is not None:
        body += f'<p class="meta" data-figure="not-checked"><b>Not checked:</b> {escape(missing)}</p>'
    notes = d.notes + d.profile.notes  # what the terminal prints as notes (idle stretches, skipped rows…)
    if notes:
        body += "<h3>Notes</h3><ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>"
    return section("verdict", "Verdict", body)


def findings(d: Diagnosis) -> str:
    cards = []
    for f in d.findings:
        code = f.fix.snippet or ""
        meta = [f"confidence {f.confidence:.0%}"]
        if f.est_speedup:
            meta.insert(0, f"est. ×{f.est_speedup:.2f}")
        evidence = json.dumps(f.evidence, indent=1, default=str)
        cards.append(
            f'<div class="finding {escape(f.severity)}" data-cause="{escape(f.cause)}">'
            f'<h3><span class="badge">{escape(f.severity)}</span>{escape(f.title)} '
            f'<code>{escape(f.cause)}</code></h3><p class="meta">{escape(" · ".join(meta))}'
            f"{(' — ' + escape(f.speedup_basis)) if f.speedup_basis else ''}</p>"
            f"<p>{escape(f.summary)}</p>"
            + (f"<p><b>Saves:</b> {escape(describe(f.saving))}</p>" if f.saving else "")
            + fix_blocks(f.fix, code)
            + f'<details class="evidence"><summary>evidence</summary><pre>{escape(evidence)}</pre></details></div>'
        )
    return section("findings", "Findings, ranked by estimated time saved", "".join(cards) or "<p>None.</p>")


def fix_blocks(fix: Fix, code: str) -> str:
    """A fix's words and code, one block per remedy it lists: they are alternatives or separate changes, and
    one Copy block holding them all would paste conflicting ``Trainer(...)`` lines into the job."""
    from pitstop.core.vocabulary import Framework
    from pitstop.remedies import remedy

    whole = f"<p><b>Fix:</b> {escape(fix.text)}</p>" + (snippet(code) if code else "")
    if len(fix.uses) < 2:
        return whole
    try:
        framework = Framework.of(fix.framework)
        advices = [remedy(u.remedy).advice(framework, u.params) for u in fix.uses]
    except (KeyError, ValueError):  # a remedy this pitstop does not know (a newer one wrote the document)
        return whole
    return "<p><b>Fix</b>, one change per block:</p>" + "".join(
        f'<div class="alternative" data-remedy="{escape(str(u.remedy))}"><p><b>{i}.</b> {escape(a.text)}</p>'
        + (snippet(a.snippet) if a.snippet else "")
        + "</div>"
        for i, (u, a) in enumerate(zip(fix.uses, advices, strict=True), 1)
    )


def _who(d: Diagnosis) -> str:
    shown = d.results.shown
    return f" (rank {shown.rank}: {shown.why})" if d.profile.world_size > 1 else ""  # as the terminal says


def step_plots(d: Diagnosis) -> list[str]:
    series = d.results.shown_series
    if series is None or not series.steps:
        return []
    who = _who(d)
    rate: dict[str, tuple[list[float], list[float]]] = {}
    for values, label in (
        (series.tokens_per_s, "all tokens (with padding)"),
        (series.real_tokens_per_s, "real tokens"),
    ):
        if all(v is not None for v in values):
            rate[label] = ([float(x) for x in series.steps], [v or 0.0 for v in values])
    tokens_plot = (
        [
            svg.lines(
                "tokens-per-step",
                f"Tokens per second, step by step{who}",
                rate,
                "optimizer step",
                "tokens/s",
                integer_x=True,
            )
        ]
        if rate
        else []
    )
    if not series.phases_known:
        return tokens_plot  # only wall times (a trace, a log): a breakdown would be one colour
    # an RL trainer's rollouts, where they were timed
    shown = Phase.breakdown(generation=Phase.GENERATE in series.phases)
    ms = {k.label: [(v or 0.0) * 1000 for v in series.phases.get(k, [])] for k in shown}
    out = [
        svg.stacked_bars(
            "step-breakdown",
            f"Where each step's time goes{who}",
            ms,
            "optimizer step",
            "time per step (ms)",
            first_x=series.steps[0],
        )
    ]
    means = {Phase(k).label: v * 1000 for k, v in series.mean_phases_s.items()}
    out.append(
        svg.hbars(
            "step-breakdown-mean",
            f"Average step, by phase{who}",
            list(means),
            list(means.values()),
            "milliseconds per step",
            colors=[svg.OKABE_ITO[i % 8] for i in range(len(means))],
        )
    )
    return out + tokens_plot


def gpu_plots(d: Diagnosis) -> list[str]:
    window = d.results.shown_gpu
    if window is None or not window.samples:
        return []
    rank = next(r for r in d.profile.ranks if r.rank == window.gpu)
    samples = rank.gpu_samples[window.first : window.last]
    start = samples[0].t if rank.window_start_t is None else rank.window_start_t
    series = d.results.series_of(window.gpu)
    marks = list(series.end_s) if series is not None else []
    t = [s.t - start for s in samples]
    out = []
    use: dict[str, tuple[list[float], list[float]]] = {}
    if all(s.util is not None for s in samples):
        use["GPU utilization (%)"] = (t, [s.util or 0.0 for s in samples])
    if all(s.mem_used is not None and s.mem_total for s in samples):
        use["memory used (%)"] = (t, [100 * (s.mem_used or 0) / (s.mem_total or 1) for s in samples])
    what = "the window" if rank.window_start_t is not None else "the log"
    if use:
        out.append(
            svg.lines(
                "gpu-timeline",
                f"GPU {window.gpu} over {what}",
                use,
                f"seconds since {what} began",
                "percent",
                marks,
                100,
            )
        )
    pcie: dict[str, tuple[list[float], list[float]]] = {}
    for key, label in (("pcie_rx", "PCIe host → GPU (MB/s)"), ("pcie_tx", "PCIe GPU → host (MB/s)")):
        if all(getattr(s, key) is not None for s in samples):
            pcie[label] = (t, [getattr(s, key) / 1e6 for s in samples])
    if pcie:
        out.append(
            svg.lines("pcie-timeline", "PCIe traffic", pcie, f"seconds since {what} began", "MB/s", marks)
        )
    return out


def rank_plots(d: Diagnosis) -> list[str]:
    per_rank = [r for r in d.results.ranks if r.step_time_s is not None]
    if len(per_rank) < 2:
        return []
    labels = [f"rank {r.rank}" for r in per_rank]
    gpus = gpu_models_line(d.profile)
    out = (
        [] if gpus is None else [f'<p class="meta" data-figure="gpu-models"><b>GPUs:</b> {escape(gpus)}</p>']
    )
    out += [
        svg.hbars(
            "per-rank-step",
            "Step time per rank",
            labels,
            [(r.step_time_s or 0.0) * 1000 for r in per_rank],
            "ms per step",
        )
    ]
    if all(r.data_wait_frac is not None for r in per_rank):
        out.append(
            svg.hbars(
                "per-rank-data-wait",
                "Share of the step spent waiting for data, per rank",
                labels,
                [100 * (r.data_wait_frac or 0.0) for r in per_rank],
                "percent of step time",
                colors=[svg.OKABE_ITO[1]] * len(per_rank),
            )
        )
    return out


def gpu_log_plots(d: Diagnosis) -> list[str]:
    """Per GPU of a log: how long the job computed on it and how busy it was then."""
    windows = d.results.gpus
    if len(windows) < 2 and not any(w.stretches for w in windows):
        return []
    labels = [f"GPU {w.gpu}" for w in windows]
    return [
        svg.hbars(
            "gpu-active-util",
            "Busy share per GPU while the job computed",
            labels,
            [100 * (w.active_util or 0.0) for w in windows],
            "percent busy while computing (0: never worked)",
            colors=[svg.OKABE_ITO[5]] * len(windows),
        )
    ]


def _traced(d: Diagnosis) -> list[tuple[RankProfile, TraceStats]]:
    return [(r, r.trace) for r in sorted(d.profile.ranks, key=lambda r: r.rank) if r.trace is not None]


def trace_plots(d: Diagnosis) -> list[str]:
    """The shown rank's trace (the first traced rank where it has none), and step time per traced rank."""
    traced = _traced(d)
    if not traced:
        return []
    shown, tr = next(((r, t) for r, t in traced if r.rank == d.results.shown.rank), traced[0])
    whose = f" (rank {shown.rank})" if len(traced) > 1 else ""
    out = []
    if tr.breakdown_ms is not None:
        by_name = tr.breakdown_ms.by_name()
        names = sorted(by_name, key=lambda k: -by_name[k])
        out.append(
            svg.hbars(
                "trace-categories",
                f"Step time by category (profiler trace{whose})",
                names,
                [by_name[k] for k in names],
                "ms per step",
                colors=[svg.OKABE_ITO[i % 8] for i in range(len(names))],
            )
        )
    for key, title, record in (
        ("temporal", "GPU time: compute, non-compute, idle", tr.temporal),
        ("idle_split", "Why the GPU sat idle", tr.idle_split),
    ):
        if record is not None:
            shares = asdict(record)  # its shares, under their field names as labels
            out.append(
                svg.hbars(
                    f"trace-{key.replace('_', '-')}",
                    title + whose,
                    list(shares),
                    [100 * v for v in shares.values()],
                    "percent",
                    colors=[svg.OKABE_ITO[(i + 2) % 8] for i in range(len(shares))],
                )
            )
    if len(traced) > 1 and all(r.steps for r, _ in traced):
        out.append(
            svg.hbars(
                "trace-per-rank",
                "Step time per rank (traces)",
                [f"rank {r.rank}" for r, _ in traced],
                [1000 * (r.mean_step_s or 0.0) for r, _ in traced],
                "ms per step",
            )
        )
    return out


def _cell(value: object) -> str:
    """A setting as the table shows it: an empty offload dict is offload switched off, not ``{}``."""
    if isinstance(value, dict):
        return ", ".join(f"{k}→{v}" for k, v in value.items()) or "off"
    return str(value)


def environment(d: Diagnosis) -> str:
    env = d.environment_table()
    rows = []
    for key in (
        "device", "gpu_name", "gpu_count", "gpus_held", "world_size", "framework", "attn_implementation", "param_dtype",
        "autocast_dtype", "tf32", "gradient_checkpointing", "micro_batch_size", "grad_accum_steps", "zero_stage",
        "offload", "counted", "step",
    ):  # fmt: skip
        if env.get(key) is not None:
            rows.append([escape(key), escape(_cell(env[key]))])
    gpus = gpu_models_line(d.profile)
    if gpus is not None:  # the model per rank, grouped (the run's gpu_name is the lowest rank's)
        rows.append(["GPUs per rank", escape(gpus)])
    model = d.profile.environment.model
    if model.model_type:
        params = model.params_total
        rows.append(["model", escape(f"{model.model_type}" + (f", {params:,} parameters" if params else ""))])
    shown = {k: v for k, v in vars(d.profile.environment.dataloader).items() if v is not None}
    if shown:
        rows.append(["DataLoader", escape(", ".join(f"{k}={v}" for k, v in shown.items()))])
    for lib, version in d.profile.environment.versions.items():
        rows.append([escape(lib), escape(str(version))])
    if d.profile.command:
        rows.append(["command", f"<code>{escape(' '.join(d.profile.command))}</code>"])
    return section("environment", "What pitstop saw", table(["", ""], rows) if rows else "")


def run_sections(d: Diagnosis) -> list[str]:
    from pitstop.report.html.ranks import rank_comm_plots

    plots = step_plots(d) + gpu_plots(d) + gpu_log_plots(d) + rank_plots(d) + rank_comm_plots(d.to_dict())
    plots += trace_plots(d)
    return [verdict(d), findings(d), section("plots", "Pictures", "".join(plots)), environment(d)]


def run_subtitle(d: Diagnosis) -> str:
    env = d.profile.environment
    device = mixed_models_words(d.profile) or env.gpu_name or env.device or "unknown device"
    return f"{d.profile.source or 'run'} · {env.framework or 'unknown framework'} on {device}"
