"""Gather logged metrics across ranks only when they are logged: each rank keeps its own running sums every
step, and the sums are reduced at logging steps (or at the epoch's end), so the ranks meet only where the
gradients make them meet.

Tunable only for the Trainer's ``include_num_input_tokens_seen``: switched off through ``TrainingArguments``,
the Trainer stops gathering the token count of every micro-batch and trains exactly the same (the count
feeds only the logs, which then lack ``num_input_tokens_seen``). A metric reduced by the job's own code
(``dist.all_reduce(loss)`` + ``.item()``, Lightning's ``self.log(..., sync_dist=True)``, torchmetrics'
``dist_sync_on_step``) is not tried: skipping or thinning that call from outside would change the values the
job logs (a rank's own loss instead of the ranks' mean, or a stale value), and a reduce that feeds the
computation cannot be told from one that feeds a log line. Those are changed in the job."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, TrialFacts, code, register
from pitstop.trials.request import FixReport, FixRequest

TOKENS_SEEN = "include_num_input_tokens_seen"


@register
class SyncMetricsLess(Remedy):
    id = RemedyId.SYNC_METRICS_LESS
    title = "metrics gathered only when logged"
    tune_rank = 100
    effect = "same training; metrics reduced across ranks only at logging steps"
    tunable = True

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``settings``: the settings that gather every step ("include_num_input_tokens_seen=True", "self.log(...,
        sync_dist=True)"); ``sites``: the job's own lines that reduce a metric; ``logging_steps``: the run's
        logging interval, when known."""
        settings: list[str] = list(params.get("settings") or [])
        sites: list[str] = list(params.get("sites") or [])
        every = params.get("logging_steps") or "N"
        parts = []
        if any(s.startswith(TOKENS_SEEN) for s in settings):
            parts.append(
                "Set include_num_input_tokens_seen=False: the Trainer then stops gathering every micro-batch's "
                "token count across the ranks (if the count is wanted, count on each rank and sum at logging "
                "steps in a callback)."
            )
        if any("sync_dist" in s for s in settings):
            parts.append(
                "Log step metrics without sync_dist=True (each rank's own value, or rank 0's) and sync them "
                "once an epoch: on_step=False, on_epoch=True, sync_dist=True."
            )
        if any("compute()" in s for s in settings):
            parts.append(
                "Call the torchmetrics metrics' compute() only at logging steps: it gathers their state across "
                "the ranks each time; update() every step is local."
            )
        if any("dist_sync_on_step" in s for s in settings):
            parts.append(
                "Build torchmetrics metrics with dist_sync_on_step=False and compute() them at logging steps."
            )
        if sites or not parts:
            where = f" at {', '.join(sites)}" if sites else ""
            parts.append(
                f"Reduce the logged metrics across ranks only every logging step{where}: keep running sums "
                f"on each rank every step (as tensors, no .item()), and all-reduce and read them every {every} "
                "steps."
            )
        tokens = any(s.startswith(TOKENS_SEEN) for s in settings) or not sites
        return Advice(" ".join(parts), self._snippet(framework, every, tokens))

    def _snippet(self, framework: Framework, every: object, tokens: bool) -> str:
        if framework.is_trainer and tokens:
            return f"args = {framework.args_class}(..., include_num_input_tokens_seen=False)"
        if framework is Framework.LIGHTNING:
            return code("""
                self.log("train_loss", loss, on_step=True, sync_dist=False)   # no gather every step
                self.log("train_loss_epoch", loss, on_step=False, on_epoch=True, sync_dist=True)
            """)
        if framework is Framework.ACCELERATE:
            return code(f"""
                running += loss.detach()                  # every step, on each rank: no sync
                if step % {every} == 0:
                    mean = accelerator.reduce(running, "mean") / {every}
                    accelerator.log({{"loss": mean.item()}}, step=step); running.zero_()
            """)
        return code(f"""
            running += loss.detach()                      # every step, on each rank: no sync
            if step % {every} == 0:
                dist.all_reduce(running)                  # once per logging step
                log(loss=running.item() / ({every} * dist.get_world_size())); running.zero_()
        """)

    def frameworks(self) -> tuple[Framework, ...]:
        return (
            Framework.HF_TRAINER,
            Framework.TRL,
            Framework.LIGHTNING,
            Framework.ACCELERATE,
            Framework.PYTORCH,
        )

    def cannot_try(self, facts: TrialFacts) -> str | None:
        if not facts.framework.is_trainer:
            return (
                "the metric is reduced by the job's own code: skipping it from outside would change the values "
                "the job logs"
            )
        return None

    def rewrite_training_args(self, args: Any, request: FixRequest, report: FixReport) -> None:
        value = getattr(args, TOKENS_SEEN, None)
        if value in (None, False, "no"):
            report.skip(self.id, f"the Trainer does not gather the token count ({TOKENS_SEEN}={value!r})")
            return
        setattr(args, TOKENS_SEEN, "no")
        report.apply(self.id, f"TrainingArguments({TOKENS_SEEN}='no')", settings=[f"{TOKENS_SEEN}={value!r}"])
