"""Rules about what goes into a step: the input pipeline, padding, host-to-device copies.

Each rule prefers measured evidence (a live run's probe, a trace) and falls back to what a log or a config
says, with lower confidence and no speed-up estimate where nothing was measured.
"""

from __future__ import annotations

import statistics

from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.diagnose.gpu_windows import active_samples, working
from pitstop.diagnose.metrics import rank_metrics
from pitstop.findings import Finding, Use, use
from pitstop.remedies import advise
from pitstop.remedies.workers import workers_for
from pitstop.vocabulary import CauseId, Device, RemedyId, Severity

DATA_WAIT_MIN = 0.05
PADDING_MIN = 0.10
DIP_UTIL = 20.0  # % utilization under which a busy GPU counts as waiting (nvidia-smi logs)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 2)


def _slowest_rank_wait(ctx: RuleContext) -> float | None:
    """Data wait of the rank that waits most: every rank waits for it, so its wait paces the job."""
    waits = [rank_metrics(r).data_wait_frac for r in ctx.profile.ranks if r.steps]
    known = [w for w in waits if w is not None]
    return max(known) if known else None


def _loader_uses(ctx: RuleContext, text_in_loop: bool) -> list[Use]:
    """Workers from the cores of the machine that ran the job (unknown for a log read elsewhere), and
    tokenizing once when examples reach the collate as text."""
    ranks = max(ctx.profile.world_size, 1)
    n = workers_for(ctx.env.cpu_count, ranks)
    basis = (
        f"{ctx.env.cpu_count} cores over {ranks} rank{'s' if ranks > 1 else ''}, one kept for each"
        if n
        else None
    )
    uses = [use(RemedyId.PRETOKENIZE)] if text_in_loop else []
    return [*uses, use(RemedyId.WORKERS, workers=n, basis=basis, pin=ctx.env.device != Device.CPU)]


def _with_workers(
    wait: float, have: int | None, workers: int | None, step_s: float | None
) -> tuple[float, str]:
    """The estimate with the fix's workers, and its basis. Workers load beside the step, each a batch in the
    time one loader takes now: the whole wait with no workers; with ``have`` of them bounding the step, ``have``
    steps. Batches then arrive every (that time) / ``workers``, and the step becomes the longer of that and
    the rest of the step. Without the fix's count (a log read elsewhere), or no more workers than now: hiding
    the whole wait, the bound."""
    measured = f"data wait is {wait:.1%} of step time (measured)"
    if workers is None or (have or 0) >= workers:
        return amdahl(wait, float("inf")), f"{measured}; hiding it fully gives at most 1/(1−f)"
    one_loader = wait if not have else float(have)  # one loader's time per batch, in steps of today
    step = max(1.0 - wait, one_loader / workers)

    def ms(x: float) -> str:
        return f"{x * step_s * 1000:.0f} ms" if step_s else f"{x:.0%} of a step"

    return 1.0 / max(step, 1e-9), (
        f"{measured}; with num_workers={workers} each worker loads a batch in the {ms(one_loader)} one loader "
        f"takes now, so one arrives every {ms(one_loader / workers)} against the {ms(1.0 - wait)} the rest of "
        "the step takes: the step becomes the longer of the two"
    )


def dataloader_bound(ctx: RuleContext) -> Finding | None:
    f = _slowest_rank_wait(ctx)
    if f is None:
        return _dips_in_log(ctx) or _workers_in_config(ctx)
    if f < DATA_WAIT_MIN:
        return None
    m = ctx.metrics
    dl = ctx.env.dataloader
    text_in_loop = bool(dl.examples_are_text)
    evidence: dict[str, object] = {
        "data_wait_frac": round(f, 3),
        "data_wait_ms_per_step": _ms(f * m.step_time_s) if m.step_time_s else None,
        "num_workers": dl.num_workers,
        "pin_memory": dl.pin_memory,
        "persistent_workers": dl.persistent_workers,
        "examples_are_text": dl.examples_are_text,
        "collate_ms_per_batch": _ms(dl.collate_s_per_batch),
        "main_process_cpu_pct": None if m.main_cpu_pct is None else round(m.main_cpu_pct, 1),
    }
    multiprocess = [t.dataloader_multiprocess for t in ctx.traces if t.dataloader_multiprocess is not None]
    if multiprocess:
        evidence["multiprocess_iterator"] = all(multiprocess)
    if len(ctx.profile.ranks) > 1:
        evidence["data_wait_frac_mean_over_ranks"] = (
            None if m.data_wait_frac is None else round(m.data_wait_frac, 3)
        )
    causes = []
    if text_in_loop:
        causes.append("examples are tokenized inside the collate function on every step")
    if dl.num_workers == 0 or (multiprocess and not any(multiprocess)):
        causes.append("the DataLoader has no worker processes (num_workers=0), so loading blocks the step")
    who = " on the rank that waits most" if len(ctx.profile.ranks) > 1 else ""
    summary = f"The step waits on the input pipeline {f:.0%} of the time{who}"
    summary += (": " + "; ".join(causes) + ".") if causes else "."
    if ctx.env.device == Device.CPU:
        summary += " (On a CPU run, workers share cores with compute; pre-tokenizing helps regardless.)"
    uses = _loader_uses(ctx, text_in_loop)
    workers = next((u.params.get("workers") for u in uses if u.remedy is RemedyId.WORKERS), None)
    est, basis = _with_workers(f, dl.num_workers, workers, m.step_time_s)
    return Finding(
        cause=CauseId.DATALOADER_BOUND,
        severity=severity_for(f, 0.20, 0.10),
        confidence=0.9,
        summary=summary,
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis.replace("(measured)", "(measured, slowest rank)") if who else basis,
        fix=advise(ctx.framework, *uses),
    )


def _dips_in_log(ctx: RuleContext) -> Finding | None:
    """nvidia-smi: a busy GPU that keeps dropping to idle is waiting between steps."""
    best: tuple[float, int, float] | None = None
    for window in working(ctx.results.gpus):  # pauses of the job are not dips between steps
        rank = next(r for r in ctx.profile.ranks if r.rank == window.gpu)
        utils = [s.util for s in active_samples(rank, window) if s.util is not None]
        if len(utils) < 20:
            continue
        # ignore the idle head and tail (start-up, shutdown): the busy period is first to last busy sample
        busy = [i for i, u in enumerate(utils) if u >= 50]
        if len(busy) < 10:
            continue
        body = utils[busy[0] : busy[-1] + 1]
        dips = [u < DIP_UTIL for u in body]
        share = sum(dips) / len(body)
        runs = sum(1 for i, d in enumerate(dips) if d and (i == 0 or not dips[i - 1]))
        if best is None or share > best[0]:
            best = (share, runs, statistics.fmean(body))
    if best is None or best[0] < 0.05 or best[1] < 3:
        return None
    share, runs, mean_util = best
    return Finding(
        cause=CauseId.DATALOADER_BOUND,
        severity=Severity.MEDIUM if share >= 0.15 else Severity.LOW,
        confidence=0.35,
        summary=(
            f"The GPU keeps dropping to idle while the job runs ({runs} dips, {share:.0%} of the busy period "
            "below 20% utilization): the pattern of steps waiting on the input pipeline, a host sync or "
            "checkpoints. A trace or `pitstop doctor` tells which."
        ),
        evidence={
            "idle_share_while_running": round(share, 3),
            "dips": runs,
            "mean_util_pct": round(mean_util, 1),
        },
        est_speedup=amdahl(share, float("inf")),
        speedup_basis="nvidia-smi samples: removing the idle dips gives at most 1/(1−share)",
        fix=advise(ctx.framework, *_loader_uses(ctx, False)),
    )


def _workers_in_config(ctx: RuleContext) -> Finding | None:
    if ctx.env.dataloader.num_workers != 0 or ctx.measured:
        return None
    return Finding(
        cause=CauseId.DATALOADER_BOUND,
        severity=Severity.LOW,
        confidence=0.3,
        summary="The config loads batches in the training process (dataloader_num_workers=0): any per-batch "
        "work (collation, on-the-fly tokenization) will stall the GPU.",
        evidence={"num_workers": 0, "sources": ctx.env.config_sources[:3]},
        est_speedup=None,
        speedup_basis="config only: measure with `pitstop doctor` to put a number on it",
        fix=advise(ctx.framework, *_loader_uses(ctx, False)),
    )


def padding_waste(ctx: RuleContext) -> Finding | None:
    m = ctx.metrics
    p = m.padding_frac
    if p is None:
        return _padding_in_config(ctx)
    if p < PADDING_MIN:
        return None
    c, share_basis = _token_share(ctx)
    kept, kept_basis = _packed_work(ctx)
    if kept is None:
        kept, kept_basis = _packed_rows(ctx)
    rows = [s.seq_len for r in ctx.profile.ranks for s in r.steps if s.seq_len]
    fixed_length = bool(rows) and len(set(rows)) == 1 and len(rows) > 2
    evidence = {
        "padding_frac": round(p, 3),
        "padded_row_len": round(m.seq_len, 1) if m.seq_len else None,
        "mean_example_len": round(m.mean_example_len, 1) if m.mean_example_len else None,
        "tokens_per_s": round(m.tokens_per_s, 1) if m.tokens_per_s else None,
        "real_tokens_per_s": round(m.real_tokens_per_s, 1) if m.real_tokens_per_s else None,
        "fixed_row_length": fixed_length,
    }
    summary = f"{p:.0%} of the tokens in each batch are padding"
    if fixed_length and m.seq_len:
        summary += f": every row is padded to {int(m.seq_len)} tokens"
        if m.mean_example_len:
            summary += f" while examples average {m.mean_example_len:.0f}"
    summary += "."
    return Finding(
        cause=CauseId.PADDING_WASTE,
        severity=severity_for(p, 0.30, 0.15),
        confidence=0.9,
        summary=summary,
        evidence=evidence,
        est_speedup=amdahl(c * (1 - kept), float("inf")) if kept is not None else amdahl(c * p, float("inf")),
        speedup_basis=(
            f"pad tokens are {p:.1%} of all tokens (measured from attention masks); {share_basis}: "
            + (kept_basis if kept is not None else "1/(1 − share·pad); attention's quadratic part gains more")
        ),
        fix=advise(ctx.framework, *_padding_uses(fixed_length)),
    )


UNPADDED = ("flash_attention_2", "flash_attention_3")  # attend per example already: padding costs dense work
VARLEN = (*UNPADDED, "flex_attention")  # packed rows attend per example


def _packed_work(ctx: RuleContext) -> tuple[float | None, str]:
    """The share of today's forward and backward FLOPs left once the batches are packed, where attention
    packs per example: dense work falls with the tokens (T → R); flex attention over padded rows computes
    each row's L² and packed, each example's own (Σ L·T over rows → Σ L² over examples), so it falls faster
    than the tokens; FlashAttention already unpads a padded batch, so its attention stays and only the dense
    work falls (slower than the tokens). With a dense mask a packed row still attends over its width and the
    share is R / T: None. Only steps that counted all four quantities are used."""
    from pitstop.plan.flops import flops_per_token

    impl = ctx.env.attention.implementation
    steps = [
        s
        for r in ctx.profile.ranks
        for s in r.steps
        if s.tokens and s.real_tokens and s.seq_len and s.attended
    ]
    fpt = flops_per_token(ctx.env.model, 1.0)  # attention FLOPs per token per position of context
    if impl not in VARLEN or not steps or fpt is None or not fpt.attention:
        return None, ""
    tokens = sum(s.tokens or 0 for s in steps)
    real = sum(s.real_tokens or 0 for s in steps)
    padded = sum((s.tokens or 0) * (s.seq_len or 0) for s in steps)  # Σ over rows of L², L the row width
    attended = sum(s.attended or 0 for s in steps)  # Σ over examples of their own L²
    now = attended if impl in UNPADDED else padded
    before = fpt.dense * tokens + fpt.attention * now
    kept = min(1.0, (fpt.dense * real + fpt.attention * attended) / before)
    how = (
        "its attention already skips the padding, the dense work falls with the tokens"
        if impl in UNPADDED
        else "dense work with the tokens, attention from each padded row's L² to each example's own"
    )
    return kept, (
        f"packed per example ({impl}), {kept:.0%} of the forward and backward FLOPs remain ({how}): "
        "1/(1 − share·(1 − kept))"
    )


def _packed_rows(ctx: RuleContext) -> tuple[float | None, str]:
    """Where attention takes a dense mask (SDPA, eager), a packed row still attends over its whole width, so
    packing saves rows, not tokens: the share of today's rows the batches' examples fill when each goes into
    the first row of the padded width it fits (counted by the probe per batch, ``packed_rows``). The last row
    of each batch keeps some padding, so this is less than the tokens' share suggests. None when uncounted."""
    if ctx.env.attention.implementation in VARLEN:
        return None, ""
    steps = [s for r in ctx.profile.ranks for s in r.steps if s.packed_rows and s.samples]
    if not steps:
        return None, ""
    kept = min(1.0, sum(s.packed_rows or 0 for s in steps) / sum(s.samples or 0 for s in steps))
    return kept, (
        f"packed first-fit into rows of the padded width (a dense mask attends over a row's width), the "
        f"batches' examples fill {kept:.0%} of today's rows: 1/(1 − share·(1 − kept))"
    )


def _token_share(ctx: RuleContext) -> tuple[float, str]:
    """The share of the step that scales with the tokens computed on, and what it rests on: the forward and
    backward when the probe timed them (the optimizer step and the data wait do not grow with padding; the
    backward holds any recompute, which does), else the compute share (a trace's kernels, or 1 − data wait)."""
    m = ctx.metrics
    traced = any(t.temporal for t in ctx.traces)
    if not traced and m.forward_frac is not None and m.backward_frac is not None:
        share = min(1.0, m.forward_frac + m.backward_frac)
        return share, (
            f"forward and backward take {share:.0%} of the step (measured) and scale with the tokens; the "
            "optimizer step does not"
        )
    c = ctx.compute_frac
    return c, f"compute takes {c:.0%} of the step and scales with tokens"


def _padding_in_config(ctx: RuleContext) -> Finding | None:
    env = ctx.env
    if env.packing is not False or env.group_by_length or ctx.measured:
        return None
    return Finding(
        cause=CauseId.PADDING_WASTE,
        severity=Severity.MEDIUM,
        confidence=0.5,
        summary=(
            "Packing is off"
            + (f" with rows of up to {env.max_seq_len} tokens" if env.max_seq_len else "")
            + ": variable-length examples will be padded, and the pad tokens computed on."
        ),
        evidence={
            "packing": False,
            "group_by_length": env.group_by_length,
            "max_seq_len": env.max_seq_len,
            "sources": env.config_sources[:3],
        },
        est_speedup=None,
        speedup_basis="config only: `pitstop data stats` or `pitstop doctor` measures the pad share",
        fix=advise(ctx.framework, *_padding_uses(False)),
    )


def pageable_copies(ctx: RuleContext) -> Finding | None:
    if not ctx.on_gpu:
        return None
    traced = ctx.trace_mean("h2d_pageable_mb")
    step = ctx.metrics.step_time_s
    if traced is not None:
        if traced <= 0 or not step:
            return None
        bytes_per_step = traced * 1e6
        basis_source = "pageable host-to-device copies in the trace"
    else:
        dl = ctx.env.dataloader
        # pinned memory overlaps nothing when the copy blocks (non_blocking=False, HF's default): such a
        # copy is as exposed as a pageable one
        blocking_pinned = bool(dl.h2d_copies_pinned_blocking) and not dl.h2d_copies_non_blocking
        if dl.pin_memory is not False and not blocking_pinned:
            return None
        steps = [s for r in ctx.profile.ranks for s in r.steps if s.h2d_bytes]
        if not steps or not step:
            return None
        bytes_per_step = sum(s.h2d_bytes or 0 for s in steps) / len(steps)
        basis_source = (
            "batch bytes copied from pinned memory with non_blocking=False"
            if blocking_pinned and dl.pin_memory is not False
            else "batch bytes with pin_memory=False"
        )
    gpu = ctx.gpu
    link = (gpu.pcie_gbps if gpu else 31.5) * 1e9
    # a pageable copy is staged through a bounce buffer (about half the pinned rate) and blocks the host
    lost = bytes_per_step / (0.4 * link) - bytes_per_step / (0.8 * link)
    frac = min(lost / step, 0.9)
    return Finding(
        cause=CauseId.PAGEABLE_COPIES,
        severity=severity_for(frac, 0.10, 0.02),
        confidence=0.7 if traced is not None else 0.6,
        summary=(
            f"Host-to-device copies cannot overlap compute ({basis_source}): {bytes_per_step / 1e6:.2f} MB per step."
        ),
        evidence={
            "pin_memory": ctx.env.dataloader.pin_memory,
            "h2d_copies_pinned_blocking": ctx.env.dataloader.h2d_copies_pinned_blocking,
            "h2d_copies_non_blocking": ctx.env.dataloader.h2d_copies_non_blocking,
            "h2d_pageable_mb_per_step": round(bytes_per_step / 1e6, 3),
            "est_copy_ms_lost": round(lost * 1000, 3),
        },
        est_speedup=amdahl(frac, float("inf")),
        speedup_basis=f"{basis_source}, at ~40% (pageable) vs ~80% (pinned) of the PCIe link rate",
        fix=advise(ctx.framework, use(RemedyId.PIN_MEMORY)),
    )


def _padding_uses(fixed_length: bool) -> list[Use]:
    """Packing first (no pad token left), else padding each batch to its longest example."""
    return [
        use(RemedyId.PACK),
        use(RemedyId.TRIM_PADDING, fixed_length=fixed_length),
        use(RemedyId.GROUP_BY_LENGTH),
    ]
