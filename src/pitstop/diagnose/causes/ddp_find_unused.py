"""DistributedDataParallel's unused-parameter search left on while every parameter gets a gradient.

With ``find_unused_parameters=True`` DDP walks the whole autograd graph from the forward's outputs after every
forward, to mark the parameters that will get no gradient, and at the end of every backward all-reduces a map of
the parameters each rank used and waits for it. When every parameter is used on every rank both are pure cost.
Transformers' Trainer turns the search on by default (``ddp_find_unused_parameters=None``: on for a model without
gradient checkpointing, and for any model that is not a ``PreTrainedModel``); Lightning's
``strategy="ddp_find_unused_parameters_true"``, Accelerate's ``DistributedDataParallelKwargs`` and hand-built
wrappers ask for it by name.

The live probe (``RankProfile.ddp``) reads the setting from the wrapper, who asked for it, the search's host time
in each measured step, and DDP's own all-reduced map of the parameters each rank used: a parameter some rank left
without a gradient makes the search necessary, and the rule says nothing; where the probe could not read the map
it says nothing either (tune would try a fix that stops a job with unused parameters). Other sources fill the
same record with less: DDP's own warning in a log (no parameter unused in the first step), attach's sampled stacks
(the search seen running, parameters not counted); a configuration alone (``Environment.ddp_find_unused_parameters``,
from ``pitstop check`` / ``analyze``) says only the setting. Each is a finding at a lower confidence."""

from __future__ import annotations

from pitstop.core.findings import Finding, use
from pitstop.core.profile import DdpSettings, RankProfile
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, Severity, Source
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.remedies import advise

LIVE_CONFIDENCE = 0.9  # the probe read the wrapper and saw every parameter used on every rank, every step
LOGGED_CONFIDENCE = 0.6  # another source saw every parameter used once (DDP's own warning in a log)
SEEN_CONFIDENCE = 0.45  # the search seen running (sampled stacks); whether every parameter is used not known
CONFIG_CONFIDENCE = 0.35  # the setting read from a config: whether every parameter is used is not known
# sources whose probe watched DDP itself: there, no DdpSettings means no DDP wrapper, whatever a config says
WATCHED = (Source.DOCTOR, Source.TUNE, Source.WATCH, Source.CALLBACK)


def _searching(settings: DdpSettings) -> bool:
    return bool(settings.find_unused_parameters) and not settings.static_graph


def _share(rank: RankProfile) -> float | None:
    """The share of the rank's measured time its DDP spent searching the graph."""
    ddp = rank.ddp
    if ddp is None or ddp.search_s is None or rank.wall_s <= 0:
        return None
    return min(ddp.search_s / rank.wall_s, 1.0)


@cause(
    CauseId.DDP_FIND_UNUSED,
    title="DDP searches for unused parameters that do not exist",
    because=(
        "DistributedDataParallel runs with find_unused_parameters=True, so after every forward it walks the "
        "whole autograd graph and at every backward's end all-reduces a map of the parameters used, yet every "
        "parameter gets a gradient on every rank: both are pure cost"
    ),
    needs_gpu=False,
    needs=((Evidence.PROCESS, Evidence.SETTINGS),),
    fires_when=(
        "the probe read find_unused_parameters=True (without static_graph) on the DDP wrapper and DDP's own "
        "all-reduced map showed every parameter used on every rank in every measured step (who set it and the "
        "job's line named); at confidence {LOGGED_CONFIDENCE:.2f} from DDP's own warning in a log that no "
        "parameter went unused, {SEEN_CONFIDENCE:.2f} where sampled stacks (attach) caught the search running, "
        "{CONFIG_CONFIDENCE:.2f} from a config's setting alone"
    ),
    estimate=(
        "the graph search's host time, measured around DDP's post-forward in each measured step, removed from "
        "the step; the used-parameter all-reduce at each backward's end is not included (the saving may be "
        "larger). From a config alone: not estimated"
    ),
    remedies=(RemedyId.NO_UNUSED_SEARCH,),
)
def ddp_find_unused(ctx: RuleContext) -> Finding | None:
    watched = [r for r in ctx.profile.ranks if r.ddp is not None]
    if watched:
        return _live(ctx, watched)
    if ctx.profile.source in WATCHED:
        return None  # the probe saw no DDP wrapper: nothing searches
    return _configured(ctx)


def _live(ctx: RuleContext, watched: list[RankProfile]) -> Finding | None:
    searching = [r for r in watched if r.ddp is not None and _searching(r.ddp)]
    if not searching:
        return None
    counts = [r.ddp.unused_parameters for r in watched if r.ddp is not None]
    if any(c for c in counts):
        return None  # some parameter went without a gradient: the search is needed
    counted = all(r.ddp is not None and r.ddp.unused_parameters is not None for r in searching)
    probed = ctx.profile.source in WATCHED
    if probed and not counted:
        # the probe could not read DDP's map (an older torch): tune would try a fix that could stop the job
        return None
    confidence = LIVE_CONFIDENCE if probed else LOGGED_CONFIDENCE if counted else SEEN_CONFIDENCE
    first = searching[0].ddp
    assert first is not None
    timed = [r for r in searching if _share(r) is not None and r.mean_step_s]
    share = sum(_share(r) or 0.0 for r in timed) / len(timed) if timed else None
    step_s = sum(r.mean_step_s or 0.0 for r in timed) / len(timed) if timed else 0.0
    search_ms = share * step_s * 1000 if share is not None else None
    who = f", set by {first.set_by}" if first.set_by else ""
    where = f"; the wrapper built at {first.site}" if first.site else ""
    params = f"all {first.parameters} parameters" if first.parameters else "every parameter"
    cost = f" ({search_ms:.1f} ms a step)" if search_ms is not None else ""
    searches = (
        f"DistributedDataParallel searches the autograd graph for unused parameters after every forward "
        f"(find_unused_parameters=True{who}{where})"
    )
    if probed:
        summary = (
            f"{searches}, yet {params} got a gradient on every rank in every measured step: the search{cost} and "
            "the used-parameter all-reduce at each backward's end buy nothing."
        )
    elif counted:
        summary = (
            f"{searches}, yet it found no unused parameter (in the steps this source saw): unless a later step "
            f"skips some, the search{cost} and the used-parameter all-reduce at each backward's end buy nothing."
        )
    else:
        summary = (
            f"{searches}{cost}. Whether every parameter gets a gradient is not known from this source: if it "
            "does, the search and the used-parameter all-reduce at each backward's end buy nothing; `pitstop "
            "doctor` on the job counts the unused parameters."
        )
    est: float | None = None
    basis = "not estimated: the search's time was not measured on this run"
    if share is not None:
        est = amdahl(share, float("inf"))
        basis = (
            f"DDP's graph search {'timed around its post-forward' if probed else 'as this source saw it'}: "
            f"{search_ms:.2f} ms of a {step_s * 1000:.1f} ms "
            f"step ({share:.1%}, mean over {len(timed)} rank{'s' if len(timed) != 1 else ''}); the "
            "used-parameter all-reduce DDP waits for at each backward's end is not included, so the saving may "
            "be larger"
        )
    evidence: dict[str, object] = {
        "find_unused_parameters": True,
        "static_graph": bool(first.static_graph),
        "parameters": first.parameters,
        "unused_parameters": 0 if counted else None,
        "set_by": first.set_by,
        "site": first.site,
        "search_ms_per_step": None if search_ms is None else round(search_ms, 3),
        "search_share": None if share is None else round(share, 4),
        "ranks_searching": len(searching),
        "world_size": ctx.profile.world_size,
    }
    return Finding(
        cause=CauseId.DDP_FIND_UNUSED,
        severity=severity_for(est, 1.25, 1.05) if est is not None else Severity.MEDIUM,
        confidence=confidence,
        summary=summary,
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=advise(
            ctx.framework,
            use(RemedyId.NO_UNUSED_SEARCH, site=first.site, set_by=first.set_by, parameters=first.parameters),
        ),
    )


def _configured(ctx: RuleContext) -> Finding | None:
    env = ctx.env
    if env.ddp_find_unused_parameters is not True or (env.world_size or 2) < 2:
        return None
    sources = list(env.config_sources)
    setting = env.configured_by.get("ddp_find_unused_parameters")
    said = f" ({setting})" if setting else f" ({', '.join(sources)})" if sources else ""
    return Finding(
        cause=CauseId.DDP_FIND_UNUSED,
        severity=Severity.MEDIUM,
        confidence=CONFIG_CONFIDENCE,
        summary=(
            f"The run's configuration{said} has DistributedDataParallel search the autograd graph for unused "
            "parameters after every forward (find_unused_parameters=True). Unless some parameter really goes "
            "without a gradient (a branch the forward skips, a frozen head left trainable), the search is pure "
            "cost; `pitstop doctor` on the job counts the unused parameters and times the search."
        ),
        evidence={
            "find_unused_parameters": True,
            "set_by": setting,
            "config_sources": sources,
            "gradient_checkpointing": env.gradient_checkpointing,
        },
        est_speedup=None,
        speedup_basis=(
            "not estimated: a config does not say whether every parameter gets a gradient, nor how large the "
            "autograd graph is; pitstop doctor measures the search"
        ),
        fix=advise(ctx.framework, use(RemedyId.NO_UNUSED_SEARCH, set_by=setting)),
    )
