"""The terminal report: the verdict, where step time goes, and the ranked findings with their fixes."""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from pitstop.diagnose import Diagnosis
from pitstop.diagnose.metrics import rank_metrics
from pitstop.findings import Finding

SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan"}
# Okabe–Ito colours: distinguishable with the common colour-vision deficiencies
BREAKDOWN = (
    ("data", "data_wait_frac", "#E69F00"),
    ("forward", "forward_frac", "#56B4E9"),
    ("backward", "backward_frac", "#0072B2"),
    ("optimizer", "optimizer_frac", "#009E73"),
    ("other", "other_frac", "#999999"),
)


def _num(value: float | None, fmt: str = ",.0f", unit: str = "") -> str:
    return "unknown" if value is None else f"{value:{fmt}}{unit}"


def breakdown_bar(diagnosis: Diagnosis, width: int = 48) -> Text:
    m = diagnosis.metrics
    text = Text()
    legend = Text()
    for label, attr, colour in BREAKDOWN:
        frac = getattr(m, attr)
        if frac is None:
            continue
        cells = round(frac * width)
        text.append("█" * cells, style=colour)
        legend.append("■ ", style=colour)
        legend.append(f"{label} {frac:.0%}  ")
    if not text:
        return Text("unknown")
    return Text.assemble(text, "\n", legend)


def _headline(d: Diagnosis) -> Table:
    m, env, p = d.metrics, d.profile.environment, d.profile
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    device = env.gpu_name or env.device or "unknown device"
    if env.device == "cpu" and env.cpu_count:
        device += f" ({env.cpu_count} cores)"
    ranks = f" · {p.world_size} ranks" if p.world_size > 1 else ""
    warm = p.ranks[0].warmup_steps if p.ranks else 0
    grid.add_row(
        "Run",
        f"{env.framework or 'pytorch'} on {device}{ranks} · {m.steps_measured} steps measured "
        f"after {warm} warm-up",
    )
    thr = f"{_num(m.real_tokens_per_s)} real tokens/s"
    if m.tokens_per_s is not None and m.padding_frac is not None:
        thr += f" of {_num(m.tokens_per_s)} tokens/s ({m.padding_frac:.0%} padding)"
    elif m.real_tokens_per_s is None and m.tokens_per_s is not None:
        thr = f"{_num(m.tokens_per_s)} tokens/s (padding unknown: batches carry no attention mask)"
    if m.step_time_s is not None:
        thr += f" · {m.step_time_s:.3f} s/step"
        if m.step_time_p10_s is not None and m.step_time_p90_s is not None:
            thr += f" (p10–p90 {m.step_time_p10_s:.3f}–{m.step_time_p90_s:.3f})"
    grid.add_row("Throughput", thr)
    grid.add_row("Step time", breakdown_bar(d))
    grid.add_row("Expected", _expected_line(d))
    model = env.model
    parts = []
    if model.params_total:
        params = f"{model.params_total / 1e6:,.1f}M params"
        if model.params_trainable is not None and model.params_trainable != model.params_total:
            params += f" ({model.params_trainable / 1e6:,.2f}M trainable)"
        parts.append(f"{model.model_type or 'model'} {params}")
    parts.append(f"attention {env.attention.implementation or 'unknown'}")
    parts.append(f"dtype {env.param_dtype or '?'}, autocast {env.autocast_dtype or 'off'}")
    dl = env.dataloader
    if dl.num_workers is not None:
        parts.append(f"DataLoader workers={dl.num_workers} pin_memory={dl.pin_memory} batch={dl.batch_size}")
    if env.offload:
        parts.append("offload " + ", ".join(f"{k}→{v}" for k, v in env.offload.items()))
    if m.gpu_util is not None:
        parts.append(f"GPU busy {m.gpu_util:.0%}")
    grid.add_row("Seen", " · ".join(parts))
    return grid


def _expected_line(d: Diagnosis) -> str:
    m, env = d.metrics, d.profile.environment
    if not env.on_gpu:
        return "MFU needs a GPU from pitstop's hardware table (this run is on the CPU)"
    if m.gpu is None:
        return f"unknown: '{env.gpu_name}' is not in pitstop's hardware table, so no peak to compare with"
    if m.expected_tokens_per_s is None:
        return "unknown: the model's parameter count was not found"
    lo, hi = m.expected_tokens_per_s
    line = f"this GPU should do about {lo:,.0f}–{hi:,.0f} tokens/s for this model at 40–50% MFU"
    if m.real_tokens_per_s is not None:
        line += f"; you do {m.real_tokens_per_s:,.0f}"
    if m.mfu is not None:
        line += f" (MFU {m.mfu:.1%} in {m.compute_dtype})"
    return line


def _finding_panel(i: int, f: Finding) -> Panel:
    style = SEVERITY_STYLE[f.severity]
    head = Text.assemble(
        (f"{i}. {f.severity.upper()} ", style),
        (f"{f.cause}", "bold"),
        f"  {f.title}",
        ("  est. ×" + f"{f.est_speedup:.2f}" if f.est_speedup else "  est. unknown", "bold green"),
        f"  confidence {f.confidence:.0%}",
    )
    evidence = ", ".join(f"{k}={v}" for k, v in f.evidence.items() if v is not None)
    body: list = [
        Text(f.summary),
        Text.assemble(("evidence  ", "dim"), evidence),
        Text.assemble(("estimate  ", "dim"), f.speedup_basis),
        Text.assemble(("fix       ", "dim"), f.fix.text),
    ]
    snippet = f.fix.snippet
    if snippet:
        lang = "json" if f.fix.framework == "deepspeed" else "python"
        body.append(Syntax(snippet, lang, theme="ansi_dark", background_color="default", word_wrap=True))
    return Panel(Group(*body), title=head, title_align="left", border_style=style, padding=(0, 1))


def _ranks_table(d: Diagnosis) -> Table:
    table = Table(title="Per rank", title_justify="left", show_edge=False)
    for col in ("rank", "steps", "s/step", "data wait", "tokens/s", "real tokens/s"):
        table.add_column(col, justify="right")
    for r in d.profile.ranks:
        rm = rank_metrics(r)
        table.add_row(
            str(rm.rank),
            str(rm.steps),
            _num(rm.step_time_s, ".3f"),
            _num(rm.data_wait_frac, ".0%"),
            _num(rm.tokens_per_s),
            _num(rm.real_tokens_per_s),
        )
    return table


def render(diagnosis: Diagnosis, console: Console | None = None) -> None:
    console = console or Console(stderr=False)
    console.print(
        Panel(_headline(diagnosis), title="pitstop doctor", title_align="left", border_style="bold")
    )
    if diagnosis.profile.world_size > 1:
        console.print(_ranks_table(diagnosis))
    if diagnosis.findings:
        console.print(Text("Findings, ranked by estimated time saved", style="bold"))
        for i, finding in enumerate(diagnosis.findings, 1):
            console.print(_finding_panel(i, finding))
    else:
        console.print(
            Text("No finding: nothing in this run points to a known cause of slowness.", style="green")
        )
    if diagnosis.skipped_checks:
        names = ", ".join(diagnosis.skipped_checks)
        console.print(Text(f"Not checked on a CPU run (they need a GPU): {names}", style="dim"))
    for note in diagnosis.notes:
        console.print(Text(f"note: {note}", style="dim"))
