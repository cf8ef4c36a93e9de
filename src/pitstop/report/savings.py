"""A finding's saving over the rest of the run, in words, for the terminal, HTML and tracker reports."""

from __future__ import annotations

from pitstop.core.findings import Finding, Saving


def describe(saving: Saving) -> str:
    """One line: '2.1 h (17 GPU-h, $42) over the 4,900 steps left'."""
    parts = [f"{saving.gpu_hours:,.3g} GPU-h"] if saving.gpus > 1 else []
    if saving.money is not None:
        parts.append(f"${saving.money:,.2f}")
    extra = f" ({', '.join(parts)})" if parts else ""
    return f"{duration(saving.seconds)}{extra} over the {saving.remaining_steps:,} steps left"


def context_line(saving: Saving) -> str:
    """Where a saving's figures come from, once for all findings."""
    price = "" if saving.price_per_gpu_hour is None else f", at ${saving.price_per_gpu_hour:g} per GPU-hour"
    gpus = f" on {saving.gpus} GPUs" if saving.gpus > 1 else ""
    if saving.gpus == 0:
        gpus = " on the CPU (wall time only: no GPU-hours, no money)"
    return (
        f"Saved over the rest of the run: {saving.remaining_steps:,} of {saving.total_steps:,} steps left "
        f"({saving.length_from}) at {saving.step_s:.3g} s/step{gpus}{price}"
    )


def duration(seconds: float) -> str:
    """A wall time as people say it: '45 s', '12 min', '3.4 h', '2.1 days'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def first_saving(findings: list[Finding]) -> Saving | None:
    """The saving whose context (steps left, step time, GPUs, price) every finding shares."""
    return next((f.saving for f in findings if f.saving is not None), None)
