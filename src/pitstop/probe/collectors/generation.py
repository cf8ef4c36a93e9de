"""Rollout generation inside the training steps: an online RL trainer (TRL's GRPOTrainer, RLOOTrainer,
OnlineDPOTrainer and their kin: any trainer whose config has ``use_vllm``) samples completions before it trains
on them, every step or every ``steps_per_generation`` steps, and that generation is often most of the step.

At the first optimizer step (``begin``) the trainer on the call stack is read: its class and its rollout
settings go into the environment (``RlSettings``). From then on the generation entry points are wrapped
through the probe's hooks (restored with them), each handing every call on unchanged: transformers'
``GenerationMixin.generate`` and ``generate_batch`` (continuous batching), TRL's ``VLLMGeneration.generate`` and
``sync_weights`` (vLLM colocate and server modes), and vLLM's own ``LLM.generate`` for a loop that drives vLLM
itself. Only the outermost call on a thread counts (TRL's vLLM wrapper calling ``LLM.generate`` is one call).

Each call is marked on the step timeline (``ProbeContext.mark_generation``), so its time is the step's GENERATE
phase, carved out of the forward or other time it ran in; a call on another thread (an asynchronous trainer
generating beside training) or while the model evaluates is not marked and not counted. The collector counts
the calls, their host seconds and what they returned (completions and tokens, from shapes and list lengths:
no device sync).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from pitstop.core.profile import GenerationStats, RankProfile, RlSettings
from pitstop.probe.collectors.base import Collector, ProbeContext, collector
from pitstop.probe.environment import trainer_on_stack
from pitstop.probe.hooks import Hooks

WEIGHT_SYNC = (
    "vLLM weight sync (TRL)"  # a call that generates nothing: timed as generation, not counted as one
)
# (module, owner class, method, the label reported); a module not imported by the first step is not wrapped
TARGETS: tuple[tuple[str, str, str, str], ...] = (
    ("transformers.generation.utils", "GenerationMixin", "generate", "transformers generate"),
    (
        "transformers.generation.continuous_batching.continuous_api",
        "ContinuousMixin",
        "generate_batch",
        "transformers continuous batching",
    ),
    ("trl.generation.vllm_generation", "VLLMGeneration", "generate", "vLLM generate (TRL)"),
    ("trl.generation.vllm_generation", "VLLMGeneration", "sync_weights", WEIGHT_SYNC),
    ("vllm.entrypoints.llm", "LLM", "generate", "vLLM generate"),
)
# trainers that generate their training data: TRL's online ones by class (subclasses included), and any
# trainer whose arguments have ``use_vllm`` (every TRL config of a generating trainer has it)
ONLINE_TRAINERS = frozenset(
    {
        "GRPOTrainer",
        "RLOOTrainer",
        "OnlineDPOTrainer",
        "GKDTrainer",
        "GOLDTrainer",
        "DistillationTrainer",
        "PPOTrainer",
        "XPOTrainer",
        "NashMDTrainer",
    }
)


def online_trainer(trainer: Any) -> bool:
    """Whether ``trainer`` generates its own training data (an online RL / on-policy trainer)."""
    if trainer is None:
        return False
    names = {c.__name__ for c in type(trainer).__mro__}
    return bool(names & ONLINE_TRAINERS) or hasattr(getattr(trainer, "args", None), "use_vllm")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def rl_settings(trainer: Any) -> RlSettings:
    """The trainer's rollout settings, as its arguments hold them once resolved (GRPOConfig fills
    ``generation_batch_size`` and ``steps_per_generation`` in its ``__post_init__``)."""
    args = getattr(trainer, "args", None)

    def get(name: str) -> Any:
        return getattr(args, name, None)

    use_vllm = get("use_vllm")
    use_vllm = use_vllm if isinstance(use_vllm, bool) else None
    mode = get("vllm_mode")
    memory = get("vllm_gpu_memory_utilization")
    batching = get("use_transformers_continuous_batching") or get("use_transformers_paged")
    return RlSettings(
        trainer=type(trainer).__name__,
        use_vllm=use_vllm,
        vllm_mode=str(mode) if use_vllm and mode is not None else None,
        vllm_gpu_memory_utilization=float(memory) if use_vllm and isinstance(memory, int | float) else None,
        continuous_batching=bool(batching) if batching is not None else None,
        num_generations=_int(get("num_generations")),
        generation_batch_size=_int(get("generation_batch_size")),
        steps_per_generation=_int(get("steps_per_generation")),
        num_iterations=_int(get("num_iterations")),
        max_completion_length=_int(get("max_completion_length")) or _int(get("max_new_tokens")),
    )


def produced(label: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> tuple[int, int] | None:
    """(completions, tokens) one call returned, from shapes and list lengths only; None when not readable."""
    if label == "transformers generate":
        sequences = getattr(out, "sequences", out)
        prompt = kwargs.get("input_ids", args[0] if args else None)
        shape, before = getattr(sequences, "shape", None), getattr(prompt, "shape", None)
        if shape is None or len(shape) != 2:
            return None
        width = int(shape[1]) - (int(before[-1]) if before is not None and len(before) else 0)
        return int(shape[0]), int(shape[0]) * max(width, 0)
    if label == "transformers continuous batching" and isinstance(out, dict):
        lengths = [len(getattr(o, "generated_tokens", ()) or ()) for o in out.values()]
        return len(lengths), sum(lengths)
    if label == "vLLM generate (TRL)" and isinstance(out, tuple) and len(out) >= 2:
        completions = out[1]
        return (len(completions), sum(len(c) for c in completions)) if isinstance(completions, list) else None
    if label == "vLLM generate" and isinstance(out, list):
        outputs = [c for request in out for c in getattr(request, "outputs", ())]
        return len(outputs), sum(len(getattr(c, "token_ids", ()) or ()) for c in outputs)
    return None


def install_generation_watch(
    hooks: Hooks,
    on_start: Callable[[], bool],
    on_end: Callable[[str, float, tuple[int, int] | None], None],
    targets: tuple[tuple[str, str, str, str], ...] = TARGETS,
) -> list[str]:
    """Wrap every generation entry point of an already imported module; returns the labels wrapped.

    ``on_start()`` says whether the outermost call is to be counted (then ``on_end(label, seconds,
    produced)`` follows it); both run inside the probe's guard, the job's call never depends on them."""
    depth = threading.local()
    wrapped: list[str] = []

    def make(label: str) -> Callable[[Any], Any]:
        def wrap(original: Any) -> Any:
            def generate(*args: Any, **kwargs: Any) -> Any:
                level = getattr(depth, "n", 0)
                depth.n = level + 1
                counted: list[bool] = []
                if level == 0 and hooks.active:
                    hooks.listener.guard(lambda: counted.append(on_start()))
                t0 = time.perf_counter()
                out = None
                try:
                    out = original(*args, **kwargs)
                    return out
                finally:
                    seconds = time.perf_counter() - t0
                    depth.n = level
                    if counted and counted[0]:
                        hooks.listener.guard(
                            lambda: on_end(label, seconds, produced(label, args[1:], kwargs, out))
                        )

            return generate

        return wrap

    for module_name, owner_name, fn, label in targets:
        owner = getattr(sys.modules.get(module_name), owner_name, None)
        if owner is None or not callable(getattr(owner, fn, None)):
            continue
        hooks.patch(owner, fn, make(label))
        wrapped.append(label)
    return wrapped


@collector
class GenerationCollector(Collector):
    """The counters are ``GenerationStats`` (the profile's own dataclass); None until a call was seen or an
    online trainer recognised."""

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.stats: GenerationStats | None = None
        self.wrapped: list[str] = []
        self._counting = False
        self._last_step = 0  # the step of the last counted call (a step's calls count it once)

    def begin(self) -> None:
        _, trainer = trainer_on_stack()
        if online_trainer(trainer):
            if self.ctx.environment is not None:
                self.ctx.environment.rl = rl_settings(trainer)
            self.ctx.watch_generation()  # every step carries generate_s from here on, 0.0 without a call
        self.wrapped = install_generation_watch(self.ctx.hooks, self._start, self._end)

    def _start(self) -> bool:
        return self.ctx.mark_generation(True)

    def _end(self, label: str, seconds: float, made: tuple[int, int] | None) -> None:
        self.ctx.mark_generation(False)
        if not self._counting:
            return
        stats = self.stats = self.stats or GenerationStats()
        stats.seconds += seconds
        stats.calls_by[label] = stats.calls_by.get(label, 0) + 1
        if label == WEIGHT_SYNC:
            return
        stats.calls += 1
        step = self.ctx.step_index()
        if step != self._last_step:
            stats.steps_generating += 1
            self._last_step = step
        if made is None:
            stats.sequences = stats.tokens = None
        elif stats.sequences is not None and stats.tokens is not None:
            stats.sequences += made[0]
            stats.tokens += made[1]

    def start_window(self) -> None:
        self._counting = True
        self._last_step = 0
        env = self.ctx.environment
        self.stats = GenerationStats() if env is not None and env.rl is not None else None

    def stop_window(self) -> None:
        self._counting = False

    def fill(self, draft: RankProfile) -> None:
        draft.generation = self.stats
