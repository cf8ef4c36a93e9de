"""DDP's unused-parameter search off where every parameter gets a gradient: no graph walk after each forward,
no used-parameter all-reduce at each backward's end. The gradients are the same (the same sums, reduced by the
same all-reduce), so the training is the same.

The trial switches it off from outside the job: ``DistributedDataParallel``'s constructor is wrapped as soon
as torch loads it and builds every wrapper with ``find_unused_parameters=False``, whoever asked for the search
(the job's own line, a Trainer's default, Lightning's strategy, Accelerate's kwargs all end in that
constructor). Tune proposes it only where the live probe saw every parameter used on every rank: with an unused
parameter DDP would stop the job at the next step ("Expected to have finished reduction")."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, TrialFacts, at_first_optimizer_step, code, register
from pitstop.trials.request import FixReport, FixRequest


@register
class NoUnusedSearch(Remedy):
    id = RemedyId.NO_UNUSED_SEARCH
    title = "DDP's unused-parameter search off"
    effect = "same gradients; no graph walk after each forward"
    tunable = True
    tune_rank = 125

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``site``: the job's line that built the wrapper; ``set_by``: who asked for the search;
        ``parameters``: how many parameters were all seen to get a gradient."""
        site, set_by, count = params.get("site"), params.get("set_by"), params.get("parameters")
        said = ([f"asked for by {set_by}"] if set_by else []) + (
            [f"the wrapper built at {site}"] if site else []
        )
        where = f" ({'; '.join(said)})" if said else ""
        seen = f"all {count} parameters get" if count else "every parameter gets"
        text = (
            f"Turn DDP's unused-parameter search off{where}: {seen} a gradient, so the graph walk after every "
            "forward and the all-reduce at every backward's end buy nothing. Keep it only for a model whose "
            "forward really skips parameters; where the same ones are skipped every step, static_graph=True "
            "searches once instead."
        )
        return Advice(text, self._snippet(framework))

    def _snippet(self, framework: Framework) -> str:
        if framework.is_trainer:
            return (
                f"args = {framework.args_class}(..., ddp_find_unused_parameters=False)  "
                "# None (its default) turns it on unless the model checkpoints"
            )
        if framework is Framework.LIGHTNING:
            return code("""
                trainer = L.Trainer(..., strategy="ddp")   # not "ddp_find_unused_parameters_true"
                # or strategy=DDPStrategy(find_unused_parameters=False)
            """)
        if framework is Framework.ACCELERATE:
            return code("""
                from accelerate import Accelerator, DistributedDataParallelKwargs
                accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=False)])
            """)
        return "model = DistributedDataParallel(model, ..., find_unused_parameters=False)  # the default"

    def frameworks(self) -> tuple[Framework, ...]:
        return (
            Framework.HF_TRAINER,
            Framework.TRL,
            Framework.LIGHTNING,
            Framework.ACCELERATE,
            Framework.PYTORCH,
        )

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return None

    def on_import(self) -> Mapping[str, Any]:
        return {"torch.nn.parallel.distributed": self._force_off}

    def _force_off(self, distributed: ModuleType, request: FixRequest, report: FixReport) -> None:
        """Every DDP wrapper the trial builds gets ``find_unused_parameters=False``."""
        cls = distributed.DistributedDataParallel
        original = cls.__init__
        # torch's own signature, under any wrapper that kept it (a positional find_unused_parameters binds by it)
        signature = inspect.signature(inspect.unwrap(original))
        named = "find_unused_parameters" in signature.parameters
        done = "DistributedDataParallel(find_unused_parameters=False) where the job asked for True"

        def __init__(module: Any, *args: Any, **kwargs: Any) -> None:
            if kwargs.get("find_unused_parameters"):
                kwargs["find_unused_parameters"] = False
                report.apply(self.id, done)
            elif named and args:
                try:
                    bound = signature.bind(module, *args, **kwargs)
                except TypeError:  # DDP raises its own error for arguments it does not take
                    bound = None
                if bound is not None and bound.arguments.get("find_unused_parameters"):
                    bound.arguments["find_unused_parameters"] = False
                    report.apply(self.id, done)
                    original(*bound.args, **bound.kwargs)
                    return
            original(module, *args, **kwargs)

        __init__.__wrapped__ = original  # type: ignore[attr-defined]
        cls.__init__ = __init__

        def check() -> None:
            if self.id not in report.applied:
                report.skip(self.id, "no DistributedDataParallel wrapper searched for unused parameters")

        at_first_optimizer_step(check)
