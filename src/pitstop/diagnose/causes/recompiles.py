"""torch.compile recompiling in the training loop: compiling is meant to happen once, but a compile that
specializes to each batch's shapes (``dynamic=False``, a ``mark_static``, automatic dynamic shapes off) compiles
again for every new sequence length, and once a frame reaches torch's recompile limit (8 by default) it runs
eagerly, uncompiled, for every shape it has not seen, for the rest of the run.

The rule's inputs, per rank (the rank with the most compile seconds speaks):

* ``RankProfile.compile`` (``CompileStats``), filled by the live probe (``probe/collectors/compiles.py``) from
  torch._dynamo's compilation records: the frames compiled and recompiled in the window, their seconds, the
  steps they happened in, the guard failures behind them (``reasons``), a frame at the recompile limit
  (``cache_limit_hit``, ``limit_frame``, ``recompile_limit``), the ``dynamic=`` the job passed and its line
  (``site``). An offline source may fill the same record from a log: dynamo's warning ``torch._dynamo hit
  config.recompile_limit (8)`` with its ``function:`` and ``last reason:`` lines is ``cache_limit_hit=True``,
  ``limit_frame``, ``recompile_limit`` and ``reasons``, with no compile seconds; the rule then fires on the
  limit alone, at ``OFFLINE_CONFIDENCE``, without an estimate.
* ``RankProfile.steps``: the window's wall time, of which the compile seconds are a share.
* ``Environment.compile_dynamic`` / ``torch_compile`` (configured, from ``check`` / ``analyze``): they only word
  the fix (what ``dynamic=`` to drop) and are shown as evidence; a configuration alone is not a recompile, so
  they never make a finding by themselves.

The estimate takes away what the compiling steps cost beyond a plain step (their wall time less the median
of the window's other steps, each: dynamo's compiling, the backward's compile, the first run of each new
graph), at least dynamo's own compile seconds: what the job saves once shapes stop changing (a compile in the
warm-up, none after). A frame at the recompile limit costs what eager execution costs against
the compiled graph on new shapes: not measured here, so the finding says so and leaves it out.
"""

from __future__ import annotations

import statistics

from pitstop.core.findings import Finding, Use, use
from pitstop.core.profile import CompileStats, RankProfile
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, Severity, Source
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.remedies import advise

MIN_RECOMPILES = 2  # recompiles in the window for a finding on compile time (one may be a last short batch)
MIN_COMPILE_SHARE = 0.05  # share of the window's wall time spent compiling, for a finding on compile time
LIVE_CONFIDENCE = 0.9  # the probe read dynamo's own records of each compile
OFFLINE_CONFIDENCE = 0.7  # a log's limit warning: the limit was hit, but not when, nor for how many steps
OFFLINE = (Source.ANALYZE, Source.CHECK)  # read from artifacts: a log's warning, not dynamo's records
MIN_PLAIN_STEPS = 3  # steps without a compile, for their median as a step's own time in a compiling step
MAX_SHARE = (
    0.95  # the compiling share taken away, at most: never a ×1e9 estimate for a window that only compiled
)


def _window_s(rank: RankProfile) -> float:
    return sum(s.wall_s for s in rank.steps)


def _speaking_rank(ctx: RuleContext) -> RankProfile | None:
    ranks = [r for r in ctx.profile.ranks if r.compile is not None]
    if not ranks:
        return None

    def weight(r: RankProfile) -> tuple[float, bool, int]:
        stats = r.compile
        return (stats.compile_s, stats.cache_limit_hit, -r.rank) if stats else (0.0, False, -r.rank)

    return max(ranks, key=weight)


def _compile_cost(rank: RankProfile, stats: CompileStats) -> tuple[float, float | None]:
    """The window's seconds that go once shapes stop changing, and the compiling steps' excess over a plain
    step (None: too few plain steps, or the steps that compiled unknown)."""
    marked = set(stats.compiling_steps)
    compiling = [s.wall_s for s in rank.steps if s.index in marked]
    plain = [s.wall_s for s in rank.steps if s.index not in marked]
    if not compiling or len(plain) < MIN_PLAIN_STEPS:
        return stats.compile_s, None
    excess = sum(compiling) - len(compiling) * statistics.median(plain)
    return max(stats.compile_s, excess), excess


def _fix_uses(stats: CompileStats, dynamic: bool | None) -> list[Use]:
    """Dynamic shapes first (no extra compute), unless the job compiles dynamically already; buckets then."""
    uses = [] if dynamic is True else [use(RemedyId.DYNAMIC_COMPILE, dynamic=dynamic, site=stats.site)]
    return [*uses, use(RemedyId.LENGTH_BUCKETS)]


@cause(
    CauseId.RECOMPILES,
    title="torch.compile recompiles in the training loop",
    because=(
        "torch.compile specializes to each batch's shapes (dynamic=False, mark_static), so every new sequence "
        "length compiles again, and a frame that reaches the recompile limit runs eagerly from then on"
    ),
    needs_gpu=False,
    needs=((Evidence.PROCESS, Evidence.SETTINGS),),
    fires_when=(
        "the probe saw ≥ {MIN_RECOMPILES} recompiles in the measured window taking ≥ {MIN_COMPILE_SHARE:.0%} of "
        "its wall time, or a frame reached torch's recompile limit (live, or dynamo's warning in a log); a "
        "configured dynamic=False alone is no finding"
    ),
    estimate=(
        "the compiling steps' time beyond a plain step (the median of the others; at least dynamo's compile "
        "seconds) taken away: shapes that stop changing compile once, in the warm-up; a frame at the "
        "recompile limit: not estimated (what eager costs against compiled is not measured)"
    ),
    remedies=(RemedyId.DYNAMIC_COMPILE, RemedyId.LENGTH_BUCKETS),
)
def recompiles(ctx: RuleContext) -> Finding | None:
    rank = _speaking_rank(ctx)
    if rank is None or rank.compile is None:
        return None
    stats = rank.compile
    window_s = _window_s(rank)
    share = stats.compile_s / window_s if window_s > 0 else 0.0
    costly = stats.recompiles >= MIN_RECOMPILES and share >= MIN_COMPILE_SHARE and bool(rank.steps)
    if not costly and not stats.cache_limit_hit:
        return None
    dynamic = stats.dynamic if stats.dynamic is not None or stats.site else ctx.env.compile_dynamic
    live = ctx.profile.source not in OFFLINE
    evidence: dict[str, object] = {
        "recompiles": stats.recompiles,
        "steps_compiling": stats.steps_compiling,
        "steps_measured": len(rank.steps),
        "compile_s": round(stats.compile_s, 2),
        "window_s": round(window_s, 2),
        "compile_share": round(share, 3),
        "compiled_frames": stats.compiled_frames,
        "reasons": list(stats.reasons),
        "dynamic": dynamic,
        "compile_site": stats.site,
        "cache_limit_hit": stats.cache_limit_hit,
        "recompile_limit": stats.recompile_limit,
        "limit_frame": stats.limit_frame,
        "graph_breaks": stats.graph_breaks,
        "configured_dynamic": ctx.env.compile_dynamic,
        "source": "probe" if live else "log",
        "rank": rank.rank,
    }
    est, basis = _estimate(rank, stats, window_s, costly, evidence)
    return Finding(
        cause=CauseId.RECOMPILES,
        severity=severity_for(est, 1.25, 1.05) if est is not None else Severity.MEDIUM,
        confidence=LIVE_CONFIDENCE if live else OFFLINE_CONFIDENCE,
        summary=_summary(rank, stats, window_s, share, costly, dynamic),
        evidence=evidence,
        est_speedup=est,
        speedup_basis=basis,
        fix=advise(ctx.framework, *_fix_uses(stats, dynamic)),
    )


def _summary(
    rank: RankProfile, stats: CompileStats, window_s: float, share: float, costly: bool, dynamic: bool | None
) -> str:
    parts = []
    if costly:
        parts.append(
            f"torch.compile recompiled {stats.recompiles} times in the {len(rank.steps)} measured steps "
            f"({stats.steps_compiling} steps compiling, {stats.compile_s:.1f} s of {window_s:.1f} s: "
            f"{share:.0%} of the window)"
        )
    if stats.cache_limit_hit:
        frame = f" {stats.limit_frame}" if stats.limit_frame else ""
        limit = f" ({stats.recompile_limit})" if stats.recompile_limit else ""
        parts.append(
            f"a frame{frame} reached the recompile limit{limit}: it runs eagerly, uncompiled, for every shape "
            "it has not seen, for the rest of the run"
        )
    summary = "; ".join(parts)
    if summary.startswith("a "):
        summary = "A" + summary[1:]
    if stats.reasons:
        summary += f". Why: {stats.reasons[0]}"
    if dynamic is False:
        where = f" ({stats.site})" if stats.site else ""
        summary += f"; the job compiles with dynamic=False{where}"
    return summary + "."


def _estimate(
    rank: RankProfile, stats: CompileStats, window_s: float, costly: bool, evidence: dict[str, object]
) -> tuple[float | None, str]:
    """The speed-up once shapes stop changing and its basis; a frame at the limit alone: none."""
    if not costly:
        return None, (
            "not estimated: a frame at the recompile limit runs eagerly for new shapes, and what eager costs "
            "against the compiled graph is not measured here"
        )
    cost, excess = _compile_cost(rank, stats)
    evidence["compiling_steps_excess_s"] = None if excess is None else round(excess, 2)
    what = (
        f"the compiling steps' {cost:.1f} s beyond a plain step ({stats.compile_s:.1f} s of it dynamo's "
        "compiling, the rest each new graph's first run)"
        if excess is not None and excess > stats.compile_s
        else f"the window's {stats.compile_s:.1f} s of compiling"
    )
    basis = (
        f"{what}, {cost / window_s:.0%} of the window ({stats.recompiles} recompiles), taken away: shapes "
        "that stop changing compile once, before the window"
    )
    if stats.cache_limit_hit:
        basis += "; the frame at the recompile limit runs eagerly on new shapes, at a cost not measured here"
    return amdahl(min(cost / window_s, MAX_SHARE), float("inf")), basis
