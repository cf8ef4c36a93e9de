"""checkpoint_stall: synchronous checkpoint saves take a large share of the training time.

Live, the probe times every save inside the measured window (``RankProfile.checkpoints``): the share is
measured. A save counts in the step it delays (the one that closes after it); a save after the window's last
step (a trainer's final ``save_model``) delays no measured step and is not in ``checkpoints``. From a Trainer's outputs the saves are counted from ``save_steps`` but never timed; there the cost
of one save is an estimate — the model's weights and Adam's states written at an assumed disk speed — and is
labelled as one."""

from __future__ import annotations

from pitstop.core.findings import Finding, use
from pitstop.core.vocabulary import CauseId, Evidence, RemedyId, Severity
from pitstop.diagnose.causes.base import cause
from pitstop.diagnose.context import RuleContext, amdahl, severity_for
from pitstop.remedies import advise
from pitstop.remedies.eval_less_often import less_often

SAVE_MIN = 0.05  # share of the run's time
ASSUMED_WRITE_BPS = 1e9  # bytes/s a checkpoint is written at, for the offline estimate (local NVMe: 1–3 GB/s)
STATE_BYTES_PER_PARAM = (
    12  # fp32 weights + Adam's two fp32 moments (bf16 weights + fp32 master: about the same)
)


def _kept_share(every: int | None) -> float:
    """Share of today's save time that saving ``less_often`` removes (80% when today's interval is unknown)."""
    new = less_often(every)
    return 1.0 - every / new if every and new else 0.8


@cause(
    CauseId.CHECKPOINT_STALL,
    title="Checkpoint saves stall training",
    because=(
        "checkpoints are saved synchronously so often that the training loop spends a large share of its "
        "time waiting for them"
    ),
    needs_gpu=False,
    needs=((Evidence.PROCESS, Evidence.SETTINGS),),
    fires_when=(
        "timed `torch.save` / `save_pretrained` / Trainer / Lightning / Accelerate saves ≥ {SAVE_MIN:.0%} "
        "of the window; offline: saves counted from `save_steps`"
    ),
    estimate=(
        "saved share × (1 − old/new interval); offline an estimate: the checkpoint's bytes at an assumed "
        "{ASSUMED_WRITE_GBPS:.0f} GB/s"
    ),
    remedies=(RemedyId.SAVE_LESS_OFTEN,),
)
def checkpoint_stall(ctx: RuleContext) -> Finding | None:
    env = ctx.env
    watched = [r for r in ctx.profile.ranks if r.checkpoints is not None and r.steps]
    if watched:
        worst = max(
            watched, key=lambda r: r.checkpoints.save_s / max(r.wall_s, 1e-9) if r.checkpoints else 0.0
        )
        saves = worst.checkpoints
        assert saves is not None
        if not saves.saves:
            return None
        share = min(1.0, saves.save_s / max(worst.wall_s, 1e-9))
        if share < SAVE_MIN:
            return None
        checkpoints = saves.steps_with_saves or saves.saves
        every = round(len(worst.steps) / checkpoints)
        interval = env.save_steps or every
        removed = _kept_share(interval)
        return Finding(
            cause=CauseId.CHECKPOINT_STALL,
            severity=severity_for(share, 0.30, 0.10),
            confidence=0.9,
            summary=(
                f"Saving checkpoints took {share:.0%} of the measured time: {checkpoints} checkpoints in "
                f"{len(worst.steps)} steps, {saves.save_s / checkpoints * 1000:.0f} ms each, and the loop waits "
                "for every one."
            ),
            evidence={
                "save_frac": round(share, 3),
                "checkpoints": checkpoints,
                "save_calls": saves.saves,
                "save_s": round(saves.save_s, 3),
                "steps": len(worst.steps),
                "steps_per_save": every,
                "save_steps": env.save_steps,
                "calls": dict(saves.calls),
                "rank": worst.rank,
            },
            est_speedup=amdahl(share * removed, float("inf")),
            speedup_basis=(
                f"measured save time over the window's wall time; saving {less_often(interval)} steps apart "
                f"instead of {interval} removes {removed:.0%} of it"
                if interval
                else "measured save time over the window's wall time; saving 5× less often removes 80% of it"
            ),
            fix=advise(ctx.framework, use(RemedyId.SAVE_LESS_OFTEN, save_steps=env.save_steps, every=every)),
        )
    return _estimated_from_outputs(ctx)


def _estimated_from_outputs(ctx: RuleContext) -> Finding | None:
    """Trainer outputs: saves counted from save_steps, their cost estimated from the model's size."""
    totals, env = ctx.profile.totals, ctx.env
    params = env.model.params_total
    if totals is None or not totals.saves or not totals.train_s or not params or ctx.measured:
        return None
    per_save_s = params * STATE_BYTES_PER_PARAM / ASSUMED_WRITE_BPS
    share = min(1.0, totals.saves * per_save_s / totals.train_s)
    if share < SAVE_MIN:
        return None
    removed = _kept_share(env.save_steps)
    return Finding(
        cause=CauseId.CHECKPOINT_STALL,
        severity=Severity.MEDIUM if share >= 0.15 else Severity.LOW,
        confidence=0.4,
        summary=(
            f"{totals.saves} checkpoints (every {env.save_steps} steps) of a {params / 1e9:.2f}B-parameter model "
            f"would take about {share:.0%} of the {totals.train_s / 60:.0f}-minute run (an estimate: save times are "
            "not logged)."
        ),
        evidence={
            "saves": totals.saves,
            "save_steps": env.save_steps,
            "train_s": round(totals.train_s, 1),
            "estimated_s_per_save": round(per_save_s, 1),
            "estimated_save_frac": round(share, 3),
        },
        est_speedup=amdahl(share * removed, float("inf")),
        speedup_basis=(
            f"estimate: {STATE_BYTES_PER_PARAM} bytes per parameter (weights and Adam states) written at an assumed "
            f"{ASSUMED_WRITE_BPS / 1e9:.0f} GB/s per save, saves counted from save_steps"
        ),
        fix=advise(ctx.framework, use(RemedyId.SAVE_LESS_OFTEN, save_steps=env.save_steps)),
    )
