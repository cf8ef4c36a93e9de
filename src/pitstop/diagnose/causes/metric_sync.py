"""A cross-rank reduce or gather of a metric every step: Transformers' ``include_num_input_tokens_seen=True``
(the Trainer gathers the token count of every micro-batch and reads it back with ``.item()``), Lightning's
``self.log(..., sync_dist=True)`` on step logs, torchmetrics' ``dist_sync_on_step=True``, a loop's own
``dist.all_reduce(loss)`` + ``.item()`` for its log line. Each is a blocking sync point outside backward: every
rank waits there for the slowest, every step, to log a number; on a GPU the ``.item()`` that reads it back also
drains the stream, so the host stops queueing work ahead of the device.

Live, the probe records every Python collective with the line that issued it, outside backward (the
collectives collector: DDP's buckets, FSDP's and DeepSpeed's own communication and anything inside backward
carry no line). A small reduce or gather (a metric's bytes, not gradients or shards) from the same line in most
measured steps is this cause; its cost is the time the ranks were blocked in it (timed by the collector),
their share of the step. From configs alone (``Environment.metric_sync_per_step``: the settings that gather a
metric every step), a run of several ranks gets the finding with lower confidence and no estimate."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from pitstop.core.findings import Finding, use
from pitstop.core.profile import CollectiveRecord, RankProfile
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, Severity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.diagnose.ranks import SMALL_COLLECTIVE_BYTES
from pitstop.remedies import advise

SMALL_BYTES = SMALL_COLLECTIVE_BYTES  # at most this per call is a metric, not gradients (communication_bound
# leaves the same collectives' time out)
MOST_STEPS = 0.5  # issued from one line in at least this share of the measured steps: each step, not each log
MIN_SHARE = 0.02  # a job's own line: blocked at least this share of the step (a known setting: any share)
METRIC_OPS = ("all_reduce", "all_gather", "reduce")  # what a metric is summed or collected with
WITH_METRICS = (
    "barrier",
)  # counted with a line's metric collectives (sync_dist, torchmetrics sync behind one)
# Before the token count moved into a method of its own, the Trainer gathered it inline in its loop.
LIBRARY_SITES = (
    ("transformers/trainer.py", "Trainer._track_num_input_tokens", "include_num_input_tokens_seen=True"),
    ("transformers/trainer.py", "Trainer._inner_training_loop", "include_num_input_tokens_seen=True"),
)  # a library's line that gathers a metric because of a setting: (file, function, the setting as written)
RELAYED = (
    ("lightning", "LightningModule.log", "self.log(..., sync_dist=True)"),
    ("lightning", "LightningModule.log_dict", "self.log_dict(..., sync_dist=True)"),
    ("torchmetrics", "Metric.forward", "torchmetrics dist_sync_on_step=True"),
    (
        "torchmetrics",
        "Metric._wrap_compute.<locals>.wrapped_func",
        "torchmetrics Metric.compute() every step",
    ),
)  # a relaying call the job's line made (the collector's ``via``): (package, function, the setting)
NOT_METRICS = (
    "Trainer._get_num_items_in_batch",
    "Trainer.get_batch_samples",
)  # library lines whose small gather feeds the loss (the Trainer's average_tokens_across_devices), not a log


@dataclass
class SiteCost:
    """One issuing line's metric collectives on one rank over the window."""

    site: str
    via: str | None
    ops: set[str] = field(default_factory=set)
    calls: int = 0
    bytes: int = 0  # the largest payload of one call
    steps: set[int] = field(default_factory=set)
    cost_s: float = 0.0


def setting_of(site: str, via: str | None) -> str | None:
    """The setting that makes a library gather at this line, where the line or its relay says."""
    for where, function, setting in LIBRARY_SITES:
        if where in site.replace("\\", "/") and site.endswith(f" in {function}"):
            return setting
    if via is not None:
        package, _, call = via.partition(":")
        package = "lightning" if package == "pytorch_lightning" else package  # the package's older name
        return next(
            (setting for name, function, setting in RELAYED if (name, function) == (package, call)), None
        )
    return None


def _cost(c: CollectiveRecord) -> float:
    """Seconds the rank lost to one collective: the host blocked in it, or on a GPU, the span its stream
    waited (arrival to completion, which the host meets later at the ``.item()`` that reads it)."""
    blocked = c.blocked_s or 0.0
    if c.clock == "device" and c.done_t is not None:
        return max(blocked, c.done_t - c.issued_t)
    return blocked


def _is_metric(c: CollectiveRecord) -> bool:
    return (
        c.source == "python"
        and c.site is not None
        and c.size >= 2
        and c.op in METRIC_OPS + WITH_METRICS
        and c.bytes <= SMALL_BYTES
        and not any(c.site.endswith(f" in {name}") for name in NOT_METRICS)
    )


def rank_sites(rank: RankProfile) -> list[SiteCost]:
    """The lines that issued small metric collectives in most of this rank's measured steps (with the
    barriers they issued beside them)."""
    measured = {s.index for s in rank.steps}
    found: dict[tuple[str, str | None], SiteCost] = {}
    for c in rank.collectives:
        if c.step not in measured or not _is_metric(c):
            continue
        assert c.site is not None
        row = found.setdefault((c.site, c.via), SiteCost(c.site, c.via))
        row.ops.add(c.op)
        row.calls += 1
        row.bytes = max(row.bytes, c.bytes)
        row.steps.add(c.step)
        row.cost_s += _cost(c)
    return [
        row
        for row in found.values()
        if row.ops & set(METRIC_OPS) and len(row.steps) >= MOST_STEPS * len(measured)
    ]


@cause(
    CauseId.METRIC_SYNC,
    title="A metric gathered across ranks every step",
    because=(
        "a logged number (the loss, a token count, an accuracy) is reduced or gathered across the ranks every "
        "step and read back: a blocking sync point outside backward where every rank waits for the slowest, "
        "and on a GPU the .item() drains the stream (include_num_input_tokens_seen, Lightning's "
        "sync_dist=True on step logs, a hand-written all_reduce of the loss)"
    ),
    needs_gpu=False,
    needs=((Evidence.PROCESS, Evidence.SETTINGS),),
    fires_when=(
        "live: small collectives (≤ {SMALL_BYTES:,} bytes a call; all_reduce, all_gather, reduce, and the "
        "barriers the same line issues with them) issued outside backward by the same line in "
        "≥ {MOST_STEPS:.0%} of the measured steps, on ≥ 2 ranks: from a "
        "library setting that gathers a metric (include_num_input_tokens_seen, sync_dist, "
        "dist_sync_on_step) at any cost, from the job's own line when the ranks are blocked in them "
        "≥ {MIN_SHARE:.0%} of the step; from configs: such a setting on a run of several ranks"
    ),
    estimate=(
        "the time the ranks are blocked in those collectives, their mean share of the step, removed "
        "(1/(1 − f)); on a GPU the span the stream waits in them. It leaves out the stream drain of the "
        ".item() that reads each value back on a GPU (the host_sync finding times it); on a CPU whose cores "
        "the ranks share, a waiting rank's core runs the others, so the gain can be smaller. From configs: "
        "not estimated"
    ),
    remedies=(RemedyId.SYNC_METRICS_LESS,),
)
def metric_sync(ctx: RuleContext) -> Finding | None:
    ranks = [r for r in ctx.profile.ranks if r.steps and r.collectives]
    if ranks:
        return _live(ctx, ranks)
    return _configured(ctx)


@dataclass
class SiteRow:
    """One issuing line over the ranks: what a finding's evidence lists for it."""

    site: str
    via: str | None
    setting: str | None
    ops: list[str]
    calls_per_step: float
    bytes_per_call: int
    steps_with: int
    blocked_ms_per_step: float  # mean over the ranks
    blocked_frac_of_step: float  # mean over the ranks of its share of each rank's step


def site_rows(ranks: list[RankProfile]) -> list[SiteRow]:
    """The metric-gathering lines of the run, costliest first."""
    per_rank = [(r, rank_sites(r)) for r in ranks]
    keys = list(dict.fromkeys((s.site, s.via) for _, sites in per_rank for s in sites))
    rows = []
    for site, via in keys:
        mine = [(r, s) for r, sites in per_rank for s in sites if (s.site, s.via) == (site, via)]
        shares = [s.cost_s / len(r.steps) / r.mean_step_s for r, s in mine if r.mean_step_s]
        first_rank, first = mine[0]
        rows.append(
            SiteRow(
                site=site,
                via=via,
                setting=setting_of(site, via),
                ops=sorted(first.ops),
                calls_per_step=round(first.calls / len(first_rank.steps), 2),
                bytes_per_call=first.bytes,
                steps_with=len(first.steps),
                blocked_ms_per_step=round(
                    statistics.fmean(s.cost_s / len(r.steps) for r, s in mine) * 1000, 3
                ),
                blocked_frac_of_step=round(statistics.fmean(shares), 4) if shares else 0.0,
            )
        )
    return sorted(rows, key=lambda row: -row.blocked_frac_of_step)


def _live(ctx: RuleContext, ranks: list[RankProfile]) -> Finding | None:
    rows = site_rows(ranks)
    share = sum(row.blocked_frac_of_step for row in rows)
    settings = list(dict.fromkeys(row.setting for row in rows if row.setting))
    if not rows or (not settings and share < MIN_SHARE):
        return None
    calls = sum(row.calls_per_step for row in rows)
    ms = sum(row.blocked_ms_per_step for row in rows)
    device = ranks[0].collectives[0].clock == "device"
    left_out = (
        "the stream drain of the .item() that reads each value back (the host waits for every queued kernel)"
        if ctx.on_gpu
        else None  # a CPU has no stream to drain
    )
    evidence: dict[str, object] = {
        "sites": [asdict(row) for row in rows],
        "settings": settings,
        "calls_per_step": round(calls, 2),
        "blocked_ms_per_step": round(ms, 3),
        "blocked_frac_of_step": round(share, 4),
        "steps_measured": len(ranks[0].steps),
        "ranks": ctx.profile.world_size,
        "clock": "device" if device else "host",
        "left_out": left_out,
        "source": "live",
    }
    top = rows[0]
    more = len(rows) - 1
    summary = (
        f"{_what(top, settings)} every step ({calls:g} small collective{'s' if calls != 1 else ''} a step "
        f"outside backward, from {top.site}"
        + (f" through {top.via}" if top.via else "")
        + (f" and {more} more line{'s' if more > 1 else ''}" if more else "")
        + f"): the ranks are blocked in them {ms:.1f} ms a step ({share:.1%} of it), each one a sync point "
        "where every rank waits for the slowest."
    )
    basis = (
        f"the time the ranks were blocked in these collectives, {share:.1%} of the step (mean over "
        f"{len(ranks)} ranks, {'the stream span on the device clock' if device else 'timed on the host'}), "
        "removed"
        + (
            f"; it leaves out {left_out}"
            if left_out
            else " (a CPU run: no device stream for .item() to drain; where the ranks share the cores, a "
            "waiting rank's core runs the others, so part of this time is not lost and the gain can be smaller)"
        )
    )
    return Finding(
        cause=CauseId.METRIC_SYNC,
        severity=severity_for(share, 0.15, 0.05),
        confidence=0.9 if settings else 0.75,  # a job's own reduce may feed its computation, not only a log
        summary=summary,
        evidence=evidence,
        est_speedup=amdahl(share, float("inf")),
        speedup_basis=basis,
        fix=advise(
            ctx.framework,
            use(
                RemedyId.SYNC_METRICS_LESS,
                settings=settings,
                sites=[row.site for row in rows if not row.setting],
                logging_steps=ctx.env.logging_steps,
            ),
        ),
    )


def _what(row: SiteRow, settings: list[str]) -> str:
    if row.setting == "include_num_input_tokens_seen=True":
        return "The Trainer gathers the token count across ranks (include_num_input_tokens_seen=True)"
    if row.setting:
        return f"A logged metric is synced across ranks ({row.setting})"
    if settings:
        return f"Metrics are reduced across ranks ({', '.join(settings)} among them)"
    if not _jobs_own(row.site):
        return "A library reduces a metric across ranks"
    return "The job reduces a metric across ranks"


def _jobs_own(site: str) -> bool:
    """The collector writes the job's files as they ran (absolute) and a library's from its package."""
    return site.startswith("/") or site[1:3] in (":\\", ":/")


def _configured(ctx: RuleContext) -> Finding | None:
    """From configs alone: a setting that gathers a metric every step, on a run of several ranks."""
    configured = ctx.env.metric_sync_per_step
    if not configured or ctx.profile.world_size < 2:
        return None
    return Finding(
        cause=CauseId.METRIC_SYNC,
        severity=Severity.LOW,
        confidence=0.5,  # the setting is written down; whether it costs this run is not measured
        summary=(
            f"The configuration gathers a metric across the {ctx.profile.world_size} ranks every step "
            f"({', '.join(configured)}): a blocking sync point outside backward where every rank waits for "
            "the slowest, and on a GPU a stream drain to read the value back."
        ),
        evidence={"configured": list(configured), "ranks": ctx.profile.world_size, "source": "config"},
        est_speedup=None,
        speedup_basis="not estimated from a configuration: `pitstop doctor` times the ranks blocked in it",
        fix=advise(
            ctx.framework,
            use(
                RemedyId.SYNC_METRICS_LESS,
                settings=list(configured),
                sites=[],
                logging_steps=ctx.env.logging_steps,
            ),
        ),
    )
