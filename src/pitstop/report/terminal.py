"""The terminal report: the verdict, where step time goes, and the ranked findings with their fixes."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from pitstop.core.findings import Finding
from pitstop.core.vocabulary import Device, Phase, Source
from pitstop.diagnose import Diagnosis, counting_line, failure_line, step_line
from pitstop.diagnose.coverage import checked_line, inputs_line, no_finding_line, not_checked_line
from pitstop.diagnose.gpu_models import gpu_by_rank, gpu_models_line, mixed_models_words
from pitstop.report.energy import cost_line, energy_line
from pitstop.report.savings import context_line, describe, first_saving
from pitstop.report.untrusted import as_text
from pitstop.report.untrusted import shown as plain

SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan"}
# each phase's share of step time (a Metrics field) and its Okabe–Ito colour: distinguishable with the common
# colour-vision deficiencies
BREAKDOWN = (
    (Phase.DATA_WAIT, "data_wait_frac", "#E69F00"),
    (Phase.GENERATE, "generate_frac", "#CC79A7"),  # only a run whose steps generate rollouts has it
    (Phase.FORWARD, "forward_frac", "#56B4E9"),
    (Phase.BACKWARD, "backward_frac", "#0072B2"),
    (Phase.OPTIMIZER, "optimizer_frac", "#009E73"),
    (Phase.OTHER, "other_frac", "#999999"),
)


def _num(value: float | None, fmt: str = ",.0f", unit: str = "") -> str:
    return "unknown" if value is None else f"{value:{fmt}}{unit}"


def breakdown_bar(diagnosis: Diagnosis, width: int = 48) -> Text:
    m = diagnosis.metrics
    text = Text()
    legend = Text()
    shown = Phase.breakdown(generation=bool(m.generate_frac))
    for phase, attr, colour in BREAKDOWN:
        frac = getattr(m, attr)
        if frac is None or phase not in shown:
            continue
        cells = round(frac * width)
        text.append("█" * cells, style=colour)
        legend.append("■ ", style=colour)
        legend.append(f"{phase.word} {frac:.0%}  ")
    if not text:
        return Text("unknown")
    return Text.assemble(text, "\n", legend)


TRACE_ROLES = (
    ("Kernel", "#0072B2"),
    ("Memcpy", "#56B4E9"),
    ("Memset", "#009E73"),
    ("Communication", "#CC79A7"),
    ("Runtime", "#D55E00"),
    ("DataLoader", "#E69F00"),
    ("CPU Exec", "#F0E442"),
    ("Other", "#999999"),
)


def trace_bar(shares: dict[str, float], width: int = 48) -> Text:
    bar, legend = Text(), Text()
    for role, colour in TRACE_ROLES:
        frac = shares.get(role, 0.0)
        bar.append("█" * round(frac * width), style=colour)
        if frac >= 0.0005:
            legend.append("■ ", style=colour)
            legend.append(f"{role} {frac:.1%}  ")
    return Text.assemble(bar, "\n", legend)


def _trace_rows(d: Diagnosis, grid: Table) -> None:
    for rank in d.profile.ranks:
        t, step_ms = rank.trace, 1000 * (rank.mean_step_s or 0.0)
        if t is None or not step_ms:
            continue
        label = f"Trace r{rank.rank}" if d.profile.world_size > 1 else "Trace"
        by_name = t.breakdown_ms.by_name() if t.breakdown_ms is not None else {}
        shares = {k: v / step_ms for k, v in by_name.items()}
        grid.add_row(
            label,
            Text.assemble(
                f"{len(rank.steps)} steps of {step_ms:.1f} ms · GPU util {_num(t.gpu_util, '.1%')}\n",
                *(
                    [f"{t.steps_from}\n"]
                    if t.steps_from and not t.steps_from.startswith("ProfilerStep")
                    else []
                ),
                *(
                    ["inference / evaluation: no backward pass, no optimizer step\n"]
                    if t.workload == "inference"
                    else []
                ),
                trace_bar(shares),
            ),
        )
        if t.temporal is not None:
            idle = t.idle_split
            split = (
                f"host wait {idle.host_wait:.0%}, kernel wait {idle.kernel_wait:.0%}, other {idle.other:.0%}"
                if idle is not None
                else ""
            )
            grid.add_row(
                "",
                as_text(
                    f"GPU time: idle {t.temporal.idle:.1%} ({split}) · compute "
                    f"{t.temporal.compute:.1%} · non-compute {t.temporal.non_compute:.1%}"
                ),
            )
        if len(d.profile.ranks) > 3:
            grid.add_row("", Text(f"(+{len(d.profile.ranks) - 1} more ranks: see Per rank)", style="dim"))
            break


def _totals_row(d: Diagnosis, grid: Table) -> None:
    t = d.profile.totals
    m = d.metrics
    if t is None:
        return
    parts = []
    if t.train_s:
        parts.append(f"{t.train_s / 60:.1f} min of training")
    if t.steps:
        parts.append(f"{t.steps} steps")
    if t.samples_per_s:
        parts.append(f"{t.samples_per_s:,.2f} samples/s")
    if m.real_tokens_per_s:
        parts.append(f"{m.real_tokens_per_s:,.0f} tokens/s (Trainer-counted)")
    if m.hf_flops_per_s:
        parts.append(f"{m.hf_flops_per_s / 1e12:,.1f} TFLOP/s by the Trainer's 6·N·tokens count")
    if m.eval_frac is not None:
        parts.append(f"evaluation {m.eval_frac:.0%} of the run")
    elif t.eval_s:
        parts.append(f"{t.evals} evaluations, {t.eval_s / 60:.1f} min")
    grid.add_row("Trainer", as_text(" · ".join(parts) or "no rates in these files"))


def _gpu_log_row(d: Diagnosis, grid: Table) -> None:
    """Per GPU of a log (no steps): the whole-log mean, the share of it the job computed and how busy the
    GPU was then, and its idle stretches."""
    if any(r.steps for r in d.profile.ranks):
        return
    windows = d.results.gpus
    if not windows:
        return
    cells = []
    for w in windows[:8]:
        samples = d.profile.ranks[_rank_index(d, w.gpu)].gpu_samples[w.first : w.last]
        spark = sparkline([s.util for s in samples], 32, lo=0.0, hi=100.0)
        line = f"GPU {w.gpu}: {_num(w.mean_util, '.0%')} mean  {spark}"
        if w.never_busy:
            line += "  never worked"
        elif w.active_frac is not None and w.active_frac < 0.95:
            line += f"  computing {w.active_frac:.0%} of the log, {_num(w.active_util, '.0%')} busy then"
        cells.append(line)
    grid.add_row("GPU log", as_text("\n".join(cells)))


def _rank_index(d: Diagnosis, rank: int) -> int:
    return next(i for i, r in enumerate(d.profile.ranks) if r.rank == rank)


SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 60


def sparkline(
    values: Iterable[float | None], width: int = SPARK_WIDTH, lo: float | None = None, hi: float | None = None
) -> str:
    """Values as one line of block characters, at most ``width`` wide, for a trend at a glance.

    None and NaN are skipped. Longer series are averaged in ``width`` buckets, so a spike in a long run
    shows as a bump rather than vanishing by sampling. The scale runs from ``lo`` to ``hi`` (the data's
    own min and max where not given); a flat series draws at mid height.
    """
    data = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not data or width <= 0:
        return ""
    if len(data) > width:
        n = len(data)
        data = [statistics.fmean(data[i * n // width : (i + 1) * n // width]) for i in range(width)]
    low = min(data) if lo is None else lo
    span = (max(data) if hi is None else hi) - low
    top = len(SPARK_BLOCKS) - 1
    if span <= 0:
        return SPARK_BLOCKS[top // 2] * len(data)
    return "".join(SPARK_BLOCKS[min(top, max(0, round((v - low) / span * top)))] for v in data)


def _picture_rows(d: Diagnosis, grid: Table) -> None:
    """GPU utilization and tokens/s per step of the shown rank, each as a sparkline (where there is data)."""
    shown, series = d.results.shown, d.results.shown_series
    if series is None:
        return
    whose = f" (rank {shown.rank}: {shown.why})" if d.profile.world_size > 1 else ""
    window = d.results.gpu_of(shown.rank)
    if window is not None and window.samples >= 2:
        samples = d.profile.ranks[_rank_index(d, window.gpu)].gpu_samples[window.first : window.last]
        line = Text(sparkline([s.util for s in samples], lo=0.0, hi=100.0), style="#0072B2")
        line.append(
            plain(
                f"  min {_num(window.min_util, '.0%')} · mean {_num(window.mean_util, '.0%')} · "
                f"max {_num(window.max_util, '.0%')}{whose}"
            )
        )
        grid.add_row("GPU util", line)
    rates, what = series.rate
    if len(rates) >= 2:
        line = Text(sparkline(rates, lo=0.0), style="#009E73")
        line.append(plain(f"  {min(rates):,.0f}–{max(rates):,.0f} {what} per step{whose}"))
        grid.add_row("Tokens/s", line)


def _headline(d: Diagnosis) -> Table:
    m, env, p = d.metrics, d.profile.environment, d.profile
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    device = mixed_models_words(p) or env.gpu_name or env.device or "unknown device"  # a mix: every model
    if env.device == Device.CPU and env.cpu_count:
        device += f" ({env.cpu_count} cores)"
    ranks = f" · {p.world_size} ranks" if p.world_size > 1 else ""
    if p.source in (Source.ANALYZE, Source.CHECK) and len(p.ranks) == 1 and p.world_size > 1:
        ranks = f" · rank {p.ranks[0].rank} of {p.world_size}"
    if p.source in (Source.ANALYZE, Source.CHECK):
        read = inputs_line(p) or f"{len(p.command or [])} input(s)"  # by kind: a folder of 8 traces is 8
        grid.add_row("Read", as_text(f"{read} · {env.framework or 'framework unknown'} on {device}{ranks}"))
    else:
        warm = p.ranks[0].warmup_steps if p.ranks else 0
        rule = p.ranks[0].window_rule if p.ranks else None
        grid.add_row(
            "Run",
            as_text(
                f"{env.framework or 'pytorch'} on {device}{ranks} · {m.steps_measured} steps measured "
                f"after {warm} warm-up" + (f" (window: {rule})" if rule else "")
            ),
        )
    if m.tokens_per_s is not None or (
        m.step_time_s is not None and p.source not in (Source.ANALYZE, Source.CHECK)
    ):
        thr = f"{_num(m.real_tokens_per_s)} real tokens/s"
        if m.tokens_per_s is not None and m.padding_frac is not None:
            thr += f" of {_num(m.tokens_per_s)} tokens/s ({m.padding_frac:.0%} padding)"
        elif m.real_tokens_per_s is None and m.tokens_per_s is not None:
            thr = f"{_num(m.tokens_per_s)} tokens/s (padding unknown: batches carry no attention mask)"
        if m.step_time_s is not None:
            # the mean is the step time the findings' shares are of (time saved per step over the mean step:
            # the run's total time); the median and the spread say how steady the steps were
            mean = _mean_step_s(d)
            median = f"{m.step_time_s:.3f}"
            thr += f" · {mean:.3f} s/step mean, {median} median" if mean else f" · {median} s/step median"
            if m.step_time_p10_s is not None and m.step_time_p90_s is not None:
                thr += f" (p10–p90 {m.step_time_p10_s:.3f}–{m.step_time_p90_s:.3f})"
        grid.add_row("Throughput", as_text(thr))
    if (counted := counting_line(d.profile)) is not None:  # where tokens and steps came from
        grid.add_row("Counted", Text(counted))
    if (step := step_line(d.profile, d.metrics)) is not None:  # the unit of every per-step rate
        grid.add_row("Step", Text(step))
    _picture_rows(d, grid)
    if m.forward_frac is not None:
        grid.add_row("Step time", breakdown_bar(d))
    _trace_rows(d, grid)
    _totals_row(d, grid)
    _gpu_log_row(d, grid)
    if env.on_gpu or p.source not in (Source.ANALYZE, Source.CHECK):
        grid.add_row("Expected", as_text(_expected_line(d)))
    for label, line in (("Energy", energy_line(m)), ("Cost", cost_line(d.cost))):
        if line is not None:  # only where measured (a GPU's power) or priced
            grid.add_row(label, as_text(line))
    grid.add_row("Seen", as_text(_seen(d)))
    return grid


def _mean_step_s(d: Diagnosis) -> float | None:
    """The mean step of the rank that paces the job (the slowest, whose steps the median is of): the step time
    the findings quote (``RankProfile.mean_step_s``)."""
    ranks = [r for r in d.profile.ranks if r.steps]
    return max(ranks, key=lambda r: r.wall_s).mean_step_s if ranks else None


def _seen(d: Diagnosis) -> str:
    env, m = d.profile.environment, d.metrics
    model = env.model
    parts = []
    if model.params_total:
        params = f"{model.params_total / 1e6:,.1f}M params"
        if model.params_trainable is not None and model.params_trainable != model.params_total:
            params += f" ({model.params_trainable / 1e6:,.2f}M trainable)"
        parts.append(f"{model.model_type or 'model'} {params}")
    if env.attention.implementation:
        parts.append(f"attention {env.attention.implementation}")
    if env.param_dtype or env.autocast_dtype:
        parts.append(f"dtype {env.param_dtype or '?'}, autocast {env.autocast_dtype or 'off'}")
    dl = env.dataloader
    if dl.num_workers is not None:
        parts.append(f"DataLoader workers={dl.num_workers} pin_memory={dl.pin_memory} batch={dl.batch_size}")
    if env.micro_batch_size and dl.batch_size is None:
        parts.append(f"micro-batch {env.micro_batch_size} × accumulation {env.grad_accum_steps or 1}")
    if env.packing is not None:
        parts.append(f"packing {'on' if env.packing else 'off'}")
    if env.zero_stage is not None:
        parts.append(f"ZeRO-{env.zero_stage}")
    if env.offload:
        parts.append("offload " + ", ".join(f"{k}→{v}" for k, v in env.offload.items()))
    if env.gradient_checkpointing:
        parts.append("gradient checkpointing")
    if m.gpu_util is not None and d.profile.source not in (Source.ANALYZE, Source.CHECK):
        parts.append(f"GPU busy {m.gpu_util:.0%}")
        if m.gpu_util_active is not None and abs(m.gpu_util_active - m.gpu_util) >= 0.005:
            parts.append(f"{m.gpu_util_active:.0%} while computing")
    return " · ".join(parts) or "nothing about the configuration"


def _expected_line(d: Diagnosis) -> str:
    m, env = d.metrics, d.profile.environment
    if not env.on_gpu:
        return "MFU needs a GPU from pitstop's hardware table (this run is on the CPU)"
    if m.gpu is None:
        if not env.gpu_name:
            return (
                "unknown: the input does not name the GPU model, so there is no peak to compare with; "
                "pass --gpu (e.g. --gpu H100-SXM; `pitstop gpus` lists the models pitstop knows)"
            )
        return (
            f"unknown: '{env.gpu_name}' is not in pitstop's hardware table, so no peak to compare with; "
            "pass --gpu with the nearest model (`pitstop gpus` lists them)"
        )
    if m.expected_tokens_per_s is None:
        if d.profile.source in (Source.ANALYZE, Source.CHECK):
            return "pass --model config.json (the model's Hugging Face config) for FLOPs, MFU and expected tokens/s"
        return "unknown: the model's parameter count was not found"
    lo, hi = m.expected_tokens_per_s
    line = f"this GPU should do about {lo:,.0f}–{hi:,.0f} tokens/s for this model"
    line += f" ({m.expected_rate_basis})" if m.expected_rate_basis else " at 40–50% MFU"
    if m.real_tokens_per_s is not None:
        line += f"; you do {m.real_tokens_per_s:,.0f}"
    if m.mfu is not None:
        line += f" (MFU {m.mfu:.1%} in {m.compute_dtype})"
    return line


def _finding_panel(i: int, f: Finding) -> Panel:
    style = SEVERITY_STYLE[f.severity]
    head = Text.assemble(
        (f"{i}. {f.severity.upper()} ", style),
        (plain(f.cause), "bold"),
        plain(f"  {f.title}"),
        ("  est. ×" + f"{f.est_speedup:.2f}" if f.est_speedup else "  est. unknown", "bold green"),
        f"  confidence {f.confidence:.0%}",
    )
    evidence = ", ".join(f"{k}={v}" for k, v in f.evidence.items() if v is not None)
    body: list = [
        as_text(f.summary),
        Text.assemble(("evidence  ", "dim"), plain(evidence)),
        Text.assemble(("estimate  ", "dim"), plain(f.speedup_basis)),
        *([Text.assemble(("saves     ", "dim"), plain(describe(f.saving)))] if f.saving else []),
        Text.assemble(("fix       ", "dim"), plain(f.fix.text)),
    ]
    snippet = f.fix.snippet
    if snippet:
        lang = "json" if f.fix.framework == "deepspeed" else "python"
        body.append(
            Syntax(plain(snippet), lang, theme="ansi_dark", background_color="default", word_wrap=True)
        )
    return Panel(Group(*body), title=head, title_align="left", border_style=style, padding=(0, 1))


def _ranks_table(d: Diagnosis) -> Table:
    models = gpu_by_rank(d.profile) if mixed_models_words(d.profile) else None  # a mix: each rank's card
    if d.ranks_analysis is not None:
        from pitstop.report import ranks_view

        return ranks_view.table(d, models)
    table = Table(title="Per rank", title_justify="left", show_edge=False)
    for col in ("rank", "steps", "s/step", "data wait", "tokens/s", "real tokens/s"):
        table.add_column(col, justify="right")
    if models is not None:
        table.add_column("GPU", justify="left")
    for rm in d.results.ranks:  # in numeric rank order
        table.add_row(
            str(rm.rank),
            str(rm.steps),
            _num(rm.step_time_s, ".3f"),
            _num(rm.data_wait_frac, ".0%"),
            _num(rm.tokens_per_s),
            _num(rm.real_tokens_per_s),
            *([] if models is None else [as_text(models.get(rm.rank, "?"), one_line=True)]),
        )
    return table


def _title(diagnosis: Diagnosis) -> str:
    titles = {
        Source.ANALYZE: "pitstop analyze",
        Source.CHECK: "pitstop check",
        Source.ATTACH: "pitstop attach",
    }
    return titles.get(diagnosis.profile.source, "pitstop doctor")


def render(diagnosis: Diagnosis, console: Console | None = None) -> None:
    console = console or Console(stderr=False)
    console.print(
        Panel(_headline(diagnosis), title=_title(diagnosis), title_align="left", border_style="bold")
    )
    failed = failure_line(diagnosis.profile)
    if failed is not None:  # a crashed job: its exit and exception come first, before any finding
        console.print(as_text(failed, style="bold red"))
    if len([r for r in diagnosis.profile.ranks if r.steps]) > 1:
        console.print(_ranks_table(diagnosis))
    gpus = gpu_models_line(diagnosis.profile)
    if gpus is not None:  # every multi-rank run: the model per rank, grouped ("8× ..."; a mix shows plainly)
        console.print(as_text(f"GPUs: {gpus}"))
    if diagnosis.findings:
        console.print(Text("Findings, ranked by estimated time saved", style="bold"))
        saving = first_saving(diagnosis.findings)
        if saving is not None:
            console.print(as_text(context_line(saving), style="dim"))
        for i, finding in enumerate(diagnosis.findings, 1):
            console.print(_finding_panel(i, finding))
    else:  # "no finding" says what was checked, and is never clean where the inputs could not be analysed
        coverage = diagnosis.coverage
        console.print(as_text(no_finding_line(coverage), style="green" if coverage.clean else "yellow"))
    console.print(Text.assemble(("Checked      ", "bold"), plain(checked_line(diagnosis.coverage))))
    missing = not_checked_line(diagnosis.coverage)
    if missing is not None:
        console.print(Text.assemble(("Not checked  ", "bold"), plain(missing)), style="dim")
    if diagnosis.profile.source == Source.CHECK and not diagnosis.findings:
        console.print(
            Text("The configs raise no flag; measure the run itself with `pitstop doctor`.", style="dim")
        )
    for note in diagnosis.notes + diagnosis.profile.notes:
        console.print(as_text(f"note: {note}", style="dim"))
