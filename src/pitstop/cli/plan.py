"""``pitstop plan``: render a Plan in the terminal and as JSON (``plan.build`` makes it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pitstop.plan.build import PlanRequest, build_plan
from pitstop.plan.memory import GIB, Setup, held_after_forward
from pitstop.plan.planner import Plan
from pitstop.report.untrusted import as_text, markup


def render_plan(plan: Plan, console: Console | None = None) -> None:
    console = console or Console()
    s = plan.setup
    gib = plan.mem.gib()
    head = (
        f"[bold]{markup(plan.name)}[/bold] on {s.gpus}× {plan.gpu.key} ({plan.gpu.memory_gib:.1f} GiB)"
        + (f" over {s.nodes} nodes" if s.nodes > 1 else "")
        + f": {s.method} "
        f"fine-tune, {plan.params.total / 1e9:.2f}B params ({plan.params.trainable / 1e6:,.1f}M trained), "
        f"seq {s.seq}, micro-batch {s.micro_batch}, {_sharding_words(s)}, offload {s.offload}, {s.optimizer}, "
        f"{s.attn} attention"
        + _ac_words(s)
        + (", pure bf16" if s.pure_bf16 else "")
        + (", optimizer in backward" if s.optimizer_in_backward else "")
        + (", frozen base kept gathered in backward" if not s.frozen_reshard and s.method != "full" else "")
    )
    console.print(head)
    table = Table(title="Memory per GPU (GiB)", title_justify="left")
    for col in ("weights", "gradients", "optimizer", "activations", "logits", "margin", "total"):
        table.add_column(col, justify="right")
    table.add_row(
        *(
            f"{gib[k]:.2f}"
            for k in ("weights", "gradients", "optimizer", "activations", "logits", "margin", "total")
        )
    )
    console.print(table)
    if plan.simulated_activations is not None:
        console.print(
            "held for backward at the end of the forward pass (activations + fp32 logits): "
            f"{held_after_forward(s) / GIB:.2f} GiB by formula, "
            f"{plan.simulated_activations / GIB:.2f} GiB by simulating one step on fake tensors"
        )
    if plan.mem.optimizer_step:
        console.print(
            f"the optimizer step's foreach temporaries outgrow the freed activations by "
            f"{plan.mem.optimizer_step / GIB:.2f} GiB (in the total; a fused AdamW has none)"
        )
    if plan.max_seq is not None:
        console.print(
            f"longest sequence that fits at micro-batch {s.micro_batch}: [bold]{plan.max_seq:,}[/bold]"
        )
    verdict = "[green]fits[/green]" if plan.fits else "[red]does not fit[/red]"
    console.print(
        f"{verdict} in {plan.gpu.memory_gib:.1f} GiB · largest micro-batch that fits: "
        f"[bold]{plan.max_micro_batch}[/bold]"
        + (f" · gradient accumulation {plan.gradient_accumulation}" if plan.gradient_accumulation else "")
        + (" · [red]needs offload or one of the changes below[/red]" if plan.needs_offload else "")
    )
    low, high = plan.expected_tokens_per_s
    console.print(
        f"speed: {plan.fpt.total / 1e9:.2f} GFLOP per token ({plan.fpt.basis}); at 100% MFU "
        f"{plan.tokens_per_s_at_100pct:,.0f} tokens/s"
        + (f" ({plan.peak_gpu.source.rsplit('; ', 1)[-1]})" if plan.power_limit_w else "")
        + f"; expect {low:,.0f}–{high:,.0f} tokens/s: {markup(plan.rate.basis)}"
    )
    if plan.offload:
        o = plan.offload
        console.print(
            f"offload: {o['pcie_gb_per_step']} GB over PCIe per micro-batch ({o['pcie_s_per_step']} s) and "
            f"{o['cpu_optimizer_s_per_step']} s of CPU optimizer vs {o['compute_s_per_step']} s of "
            f"compute: about ×{o['est_slowdown']} slower"
        )
    if plan.comm is not None:
        render_comm(plan.comm, console)
    alt = Table(title="Changes that save memory, cheapest first", title_justify="left")
    for col in ("change", "GiB", "fits", "step time ×", "why"):
        alt.add_column(col)
    for a in plan.alternatives:
        alt.add_row(
            as_text(a.change),
            f"{a.memory_gib:.1f}",
            "yes" if a.fits else "no",
            f"{a.est_slowdown:.2f}",
            as_text(a.basis),
        )
    console.print(alt)
    for note in plan.notes:
        console.print(f"[dim]note: {markup(note)}[/dim]")


def _ac_words(s: Setup) -> str:
    """The checkpointing in the heading (", checkpointing" for full, as before)."""
    words = {"full": ", checkpointing", "selective": ", selective checkpointing", "none": ""}[s.ac_mode]
    if s.ac_mode == "selective" and s.ac_every:
        words += f" (every {s.ac_every} layers)"
    return words + (", activations offloaded" if s.ac_offload else "")


def _sharding_words(s: Setup) -> str:
    if s.sharding:
        return f"FSDP {s.sharding.upper()}"
    return f"ZeRO-{s.zero}" + (f" + hpZ {s.hpz}" if s.hpz > 1 else "")


def _secs(s: float) -> str:
    """Seconds, or milliseconds below a hundredth of a second (a small job's collectives)."""
    if s == 0:
        return "0 s"
    return f"{s:.3f} s" if s >= 0.01 else f"{s * 1000:.2f} ms"


def render_comm(comm: dict[str, Any], console: Console) -> None:
    """The step's collectives, their time against the compute the FLOPs model expects, and the options."""
    links = ", ".join(f"{k} {v:g} GB/s" for k, v in comm["links_busbw_gbps"].items())
    table = Table(
        title=f"Communication per optimizer step ({comm['strategy']})",
        title_justify="left",
    )
    for col in ("collective", "ranks", "link", "× per step", "GB on the bus", "time"):
        table.add_column(col, justify="left" if col == "collective" else "right")
    for c in comm["collectives"]:
        table.add_row(
            c["what"],
            str(c["ranks"]),
            c["link"],
            str(c["per_step"]),
            f"{c['gb_on_the_bus']:.2f}",
            _secs(c["s"]),
        )
    console.print(table)
    console.print(
        f"bus bandwidth {links}: communication {_secs(comm['comm_s_per_step'])} vs compute {_secs(comm['compute_s_per_step'])} per "
        f"optimizer step (backward {_secs(comm['backward_s_per_step'])}): {comm['comm_share_if_not_hidden']:.0%} "
        f"of the step if nothing overlaps; at best {_secs(comm['exposed_s_at_best'])} stays exposed ("
        + (
            "DDP / ZeRO-1/2 buckets hide gradient reductions behind the backward, up to its time)"
            if comm["strategy"] in ("no_shard", "zero1", "zero2")
            else "prefetching hides the next gather behind compute, up to the compute's time)"
        )
    )
    options = Table(title="Sharding options on these GPUs", title_justify="left")
    for col in ("strategy", "GiB per GPU", "fits", "GB on the bus", "GB across nodes", "comm time"):
        options.add_column(col, justify="left" if col == "strategy" else "right")
    for o in comm["options"]:
        mark = " ←" if o["strategy"] == comm["strategy"] else ""
        options.add_row(
            o["strategy"] + mark,
            f"{o['memory_gib']:.1f}",
            "yes" if o["fits"] else "no",
            f"{o['gb_on_the_bus']:.2f}",
            f"{o['gb_across_nodes']:.2f}",
            _secs(o["comm_s"]),
        )
    console.print(options)


def run_plan(json_out: Path | None, **kwargs: object) -> int:
    from pitstop.cli.outputs import check_target, is_stdout, write_output

    if json_out is not None:
        check_target(json_out, "--json")
    plan = build_plan(PlanRequest(**kwargs))  # type: ignore[arg-type]
    if json_out is not None:
        write_output(json_out, json.dumps(plan.to_dict(), indent=1))
    render_plan(plan, Console(stderr=is_stdout(json_out)))
    return 0
