"""Take the per-step ``gc.collect()`` / ``torch.cuda.empty_cache()`` out of the training loop, or make them
rare: every ``EVERY`` steps keeps a leak workaround's effect over a long run at a fraction of its cost.

Neither call changes what the model computes: a collection frees only unreachable objects, and an emptied cache
only hands free blocks back to the driver. So the trial keeps the computation (tune compares the first losses).
In the trial process, from the job's first optimizer step on, each call site's calls are let through only every
``EVERY``-th time (every ``EVERY_WITHOUT_AUTOMATIC``-th ``gc.collect()`` while the job has switched automatic
collection off, since then they are its only collector); the first call of each site always runs, so a one-off
cleanup (after loading, before evaluation) is untouched. The Trainer's ``torch_empty_cache_steps`` is unset.
What it does not check: memory over a run longer than the trial (an emptied cache kept a fragmented job under
its limit; the advice says to keep a rare call then)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.frames import job_line
from pitstop.remedies.base import Advice, Remedy, TrialFacts, at_first_optimizer_step, register
from pitstop.trials.request import FixReport, FixRequest

EVERY = 200  # steps between the calls the advice keeps (and the trial lets through, per call site)
EVERY_WITHOUT_AUTOMATIC = 10  # the same for gc.collect() when the job switched automatic collection off
GC_COLLECT = "gc.collect"
EMPTY_CACHE = "torch.cuda.empty_cache"


def _calls(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    calls = params.get("calls")
    return [c for c in calls if isinstance(c, Mapping)] if isinstance(calls, list) else []  # type: ignore[misc]


def _where(c: Mapping[str, Any]) -> str:
    site, via = c.get("site"), c.get("via")
    if via and site and site != via:
        return f" (made by {via}, under {site})"
    if site or via:
        return f" (at {site or via})"
    return ""


@register
class NoPerStepCleanup(Remedy):
    id = RemedyId.NO_PER_STEP_CLEANUP
    title = "no per-step gc.collect / empty_cache"
    effect = "same computation; the cleanup runs every few hundred steps instead of every step"
    tunable = True
    tune_rank = 135

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``calls``: the call sites seen (``call``, ``site``, ``via``, ``setting``); ``gc_enabled``: whether
        automatic collection was on (False: the job's gc.collect() calls are its only collector)."""
        calls = _calls(params)
        every = int(params.get("every") or EVERY)
        by_hand = params.get("gc_enabled") is False
        gc_every = EVERY_WITHOUT_AUTOMATIC if by_hand else every
        names = {c.get("call") for c in calls} or {GC_COLLECT, EMPTY_CACHE}
        parts: list[str] = []
        settings = sorted({str(c["setting"]) for c in calls if c.get("setting")})
        if settings:
            parts.append(
                f"Drop torch_empty_cache_steps from the {framework.args_class if framework.is_trainer else 'TrainingArguments'} "
                f"({', '.join(settings)}): the Trainer empties the CUDA cache that often, and the next step gets "
                f"the memory back from the driver again (cudaMalloc); if it is there against out-of-memory errors, "
                f"{every} or more keeps most of the gain."
            )
        for c in calls:
            if c.get("setting"):
                continue
            if c.get("call") == EMPTY_CACHE:
                parts.append(
                    f"Take torch.cuda.empty_cache() out of the step{_where(c)}: it hands the allocator's cached "
                    "blocks back to the driver (waiting for the GPU), so the next step allocates them again with "
                    "cudaMalloc; cached memory is reused, not leaked. If it is there against fragmentation or "
                    f"out-of-memory errors, call it every {every} steps."
                )
            elif c.get("call") == GC_COLLECT and by_hand:
                parts.append(
                    f"Call gc.collect() every {gc_every} steps instead of every step{_where(c)}: automatic "
                    "collection is off (gc.disable()), so these calls are the job's only collector, and each "
                    "traverses every live Python object; gc.freeze() after setup makes each traverse only what "
                    "was made since."
                )
            elif c.get("call") == GC_COLLECT:
                parts.append(
                    f"Take gc.collect() out of the step{_where(c)}: each call is a full collection that traverses "
                    "every live Python object (the dataset, the model, the libraries), and Python's automatic "
                    f"collection already frees the cyclic garbage. If it is there for a leak, call it every {every} "
                    "steps."
                )
        if not parts:
            parts.append(
                "Take the per-step gc.collect() and torch.cuda.empty_cache() calls out of the training loop (or "
                f"call them every {every} steps): each full collection traverses every live Python object, and "
                "each emptied cache is allocated again from the driver on the next step."
            )
        if framework.is_trainer and settings and names == {EMPTY_CACHE}:
            snippet = (
                f"args = {framework.args_class}(..., torch_empty_cache_steps=None)  # or {every}+ against OOM"
            )
        else:
            schedule = [
                (n, gc_every if n == GC_COLLECT else every) for n in (GC_COLLECT, EMPTY_CACHE) if n in names
            ]
            snippet = self._snippet(framework, schedule)
        return Advice(" ".join(parts), snippet)

    def _snippet(self, framework: Framework, schedule: list[tuple[Any, int]]) -> str:
        """The calls at their new intervals, where the job's framework runs code after a step."""
        if framework.is_trainer:
            head, counter, indent = (
                "class RareCleanup(TrainerCallback):  # from transformers import TrainerCallback\n"
                "    def on_step_end(self, args, state, control, **kwargs):",
                "state.global_step",
                "        ",
            )
        elif framework is Framework.LIGHTNING:
            head, counter, indent = (
                "def on_train_batch_end(self, outputs, batch, batch_idx):  # in the LightningModule / Callback",
                "batch_idx",
                "    ",
            )
        else:
            head, counter, indent = "for step, batch in enumerate(loader):\n    ...", "step", "    "
        intervals = dict.fromkeys(n for _, n in schedule)  # one `if` per interval, in the calls' order
        body = [
            f"{indent}if {counter} % {n} == 0:  # was: every step\n{indent}    "
            + "; ".join(f"{call}()" for call, m in schedule if m == n)
            for n in intervals
        ]
        return "\n".join([head, *body])

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.PYTORCH, Framework.HF_TRAINER, Framework.TRL, Framework.LIGHTNING)

    def cannot_try(self, facts: TrialFacts) -> str | None:
        return None

    # -- the trial ------------------------------------------------------------------------------------
    def on_import(self) -> Mapping[str, Any]:
        return {"torch": self._thin}

    def _thin(self, torch: ModuleType, request: FixRequest, report: FixReport) -> None:
        """Wrap gc.collect and torch.cuda.empty_cache: from the first optimizer step on, each call site's
        calls run only every EVERY-th time; everything else reaches the original unchanged."""
        import gc

        skip = (
            os.path.dirname(str(torch.__file__)),
        )  # and pitstop: the probe's wrapper relays the job's call
        started = [False]
        counts: dict[tuple[str, str], int] = {}
        thinned: dict[tuple[str, str], dict[str, Any]] = {}

        def start() -> None:
            started[0] = True

        at_first_optimizer_step(start)

        def make(call: str, original: Any) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if not started[0]:
                    return original(*args, **kwargs)
                site = job_line(sys._getframe(1), skip_parts=(), skip_prefixes=skip, with_function=True)
                if site is None:
                    return original(*args, **kwargs)
                key = (call, site)
                n = counts.get(key, 0)
                counts[key] = n + 1
                every = EVERY_WITHOUT_AUTOMATIC if call == GC_COLLECT and not gc.isenabled() else EVERY
                if n % every == 0:
                    return original(*args, **kwargs)
                if key not in thinned:
                    thinned[key] = {"call": call, "site": site, "via": None, "setting": None}
                    names = "; ".join(f"{c['call']}() at {c['site']}" for c in thinned.values())
                    report.apply(
                        self.id, f"{names}: one call in {every} let through", calls=list(thinned.values())
                    )
                return 0 if call == GC_COLLECT else None  # what the skipped call would return: nothing found

            wrapper.__wrapped__ = original  # type: ignore[attr-defined]
            return wrapper

        gc.collect = make(GC_COLLECT, gc.collect)
        cuda = getattr(torch, "cuda", None)
        for owner in (cuda, getattr(cuda, "memory", None)):
            if owner is not None and callable(vars(owner).get("empty_cache")):
                owner.empty_cache = make(EMPTY_CACHE, owner.empty_cache)

    def rewrite_training_args(self, args: Any, request: FixRequest, report: FixReport) -> None:
        every = getattr(args, "torch_empty_cache_steps", None)
        if every is not None:
            args.torch_empty_cache_steps = None
            report.apply(
                self.id,
                "TrainingArguments(torch_empty_cache_steps=None)",
                calls=[
                    {
                        "call": EMPTY_CACHE,
                        "site": None,
                        "via": None,
                        "setting": f"TrainingArguments(torch_empty_cache_steps={every})",
                    }
                ],
            )
