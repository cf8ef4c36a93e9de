"""rl_generation: the rule on hand-made profiles (an online RL trainer's generation share of the step; a loop's
generate() at a lower confidence; a saved GRPO config's settings alone), the GENERATE phase carved out of the
forward on the step timeline and shown only where measured, the generation watch's wrapper on stand-in entry
points (the outermost call counted once, every call handed on), the trainer's settings read from a real
GRPOConfig, and the advice per framework."""

from __future__ import annotations

import dataclasses
import sys
import types
from types import SimpleNamespace
from typing import Any

import pytest
from tests.factories import profile, steps

from pitstop.core.profile import GenerationStats, RlSettings, StepRecord
from pitstop.core.vocabulary import CauseId, Framework, Phase, RemedyId, Severity, Source
from pitstop.diagnose import diagnose
from pitstop.diagnose.causes.rl_generation import CONFIG_CONFIDENCE, LOOP_CONFIDENCE, TRAINER_CONFIDENCE
from pitstop.diagnose.series import step_series
from pitstop.probe.timeline import (
    BWD_END,
    BWD_START,
    DATA,
    GEN_END,
    GEN_START,
    OPT_END,
    OPT_START,
    START,
    HostClock,
    StepBuilder,
    generation_span,
    phase_spans,
)
from pitstop.remedies import REGISTRY
from pitstop.remedies.base import TrialFacts

GRPO = RlSettings(
    trainer="GRPOTrainer",
    use_vllm=False,
    continuous_batching=False,
    num_generations=8,
    generation_batch_size=16,
    steps_per_generation=1,
    num_iterations=1,
    max_completion_length=1024,
)


def generating_steps(n: int = 12, wall: float = 1.0, gen: float = 0.8) -> list[StepRecord]:
    """Steps of 1 s: ``gen`` generating, then forward / backward / optimizer in what is left."""
    records = steps(n=n, wall=wall, fwd=(wall - gen) / 4, bwd=(wall - gen) / 2, opt=(wall - gen) / 8)
    for r in records:
        r.generate_s = gen
    return records


def rl_profile(gen: float = 0.8, rl: RlSettings | None = GRPO, **stats: Any) -> Any:
    p = profile(step_records=generating_steps(gen=gen), framework="trl", rl=rl)
    p.source = Source.DOCTOR
    p.ranks[0].generation = GenerationStats(
        calls=12, steps_generating=12, seconds=12 * gen, sequences=12 * 16, tokens=12 * 16 * 1024, **stats
    )
    p.ranks[0].generation.calls_by = {"transformers generate": 12}
    return p


def finding(p: Any) -> Any:
    return next((f for f in diagnose(p).findings if f.cause == CauseId.RL_GENERATION), None)


# -- the rule -------------------------------------------------------------------------------------------


def test_an_online_trainer_whose_rollouts_are_most_of_the_step_is_named_with_its_settings() -> None:
    f = finding(rl_profile(gen=0.8))
    assert f is not None and f.severity == Severity.HIGH and f.confidence == TRAINER_CONFIDENCE
    ev = f.evidence
    assert ev["generation_share"] == pytest.approx(0.8, abs=1e-3)
    assert ev["training_share"] == pytest.approx(0.2 * (1 / 4 + 1 / 2 + 1 / 8), abs=1e-3)
    assert ev["generate_calls_per_step"] == 1.0 and ev["completions_per_step"] == 16
    assert ev["tokens_generated_per_step"] == 16 * 1024 and ev["engine"] == "transformers generate"
    assert (ev["trainer"], ev["use_vllm"], ev["num_generations"], ev["max_completion_length"]) == (
        "GRPOTrainer",
        False,
        8,
        1024,
    )
    assert ev["ceiling_speedup"] == pytest.approx(5.0, rel=1e-3)
    assert f.est_speedup is None and f.speedup_basis.startswith("not estimated")
    assert f.fix.uses[0].remedy == RemedyId.FASTER_GENERATION and "use_vllm=True" in f.fix.snippets["trl"]
    assert "GRPOTrainer's rollouts take 80%" in f.summary


def test_a_small_generation_share_is_not_named_and_severity_follows_the_share() -> None:
    assert finding(rl_profile(gen=0.1)) is None
    medium = finding(rl_profile(gen=0.45))
    assert medium is not None and medium.severity == Severity.MEDIUM


def test_generate_in_a_loop_not_recognised_as_a_trainer_is_named_at_a_lower_confidence() -> None:
    f = finding(rl_profile(gen=0.7, rl=None))
    assert f is not None and f.confidence == LOOP_CONFIDENCE and f.evidence["trainer"] is None


def test_vllm_already_in_use_is_said_and_the_advice_turns_to_its_batch_and_placement() -> None:
    rl = dataclasses.replace(GRPO, use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3)
    f = finding(rl_profile(gen=0.7, rl=rl))
    assert f is not None and "vLLM is already in use (colocate mode)" in f.summary
    assert "vLLM already generates (colocate mode)" in f.fix.text


def test_steps_measured_without_generation_say_nothing_whatever_a_config_says() -> None:
    p = profile(framework="trl", rl=GRPO)
    assert all(s.generate_s is None for s in p.ranks[0].steps)
    assert finding(p) is None


def test_a_saved_grpo_config_without_vllm_is_a_low_confidence_finding_with_the_settings_only() -> None:
    p = profile(framework="trl", rl=GRPO, config_sources=["args.json"])
    p.ranks[0].steps = []
    p.source = Source.CHECK
    f = finding(p)
    assert f is not None and f.confidence == CONFIG_CONFIDENCE and f.est_speedup is None
    assert f.evidence["num_generations"] == 8 and f.evidence["config_sources"] == ["args.json"]
    assert "8 completions per prompt of up to 1024 tokens" in f.summary
    p.ranks[0].environment.rl = dataclasses.replace(GRPO, use_vllm=True, vllm_mode="server")
    assert finding(p) is None


# -- the phase: carved out of the step, shown only where measured -----------------------------------------


def test_generation_inside_the_forward_span_is_its_own_phase_and_the_parts_add_up() -> None:
    kinds = [START, DATA, GEN_START, GEN_END, BWD_START, BWD_END, OPT_START, OPT_END]
    seconds = [0.0, 0.1, 0.2, 0.9, 1.0, 1.2, 1.2, 1.3]
    forward, backward, optimizer = phase_spans(kinds, seconds)
    assert (forward, backward, optimizer) == pytest.approx((0.2, 0.2, 0.1))  # 0.1..1.0 less 0.7 generating
    assert generation_span(kinds, seconds) == pytest.approx(0.7)
    step = StepRecord(index=1, wall_s=1.5, data_wait_s=0.1, forward_s=forward, backward_s=backward,
                      optimizer_s=optimizer, generate_s=0.7)  # fmt: skip
    assert step.other_s == pytest.approx(0.2)
    assert sum(getattr(step, p) for p in Phase.breakdown(generation=True)) == pytest.approx(step.wall_s)
    assert Phase.breakdown(generation=True) == (
        Phase.DATA_WAIT, Phase.GENERATE, Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER, Phase.OTHER,
    )  # fmt: skip
    assert Phase.GENERATE not in Phase.breakdown() and Phase.GENERATE.label == "generation"
    assert Phase.GENERATE.word == "generate" and Phase.GENERATE.where == "generating rollouts"


def test_the_builder_marks_generation_and_a_watched_step_without_a_call_carries_zero() -> None:
    t = [0.0]
    clock = HostClock()
    builder = StepBuilder(clock, now=lambda: t[0])
    builder.mark(BWD_START)
    builder.mark(BWD_END)
    assert builder.end_step().generate_s is None  # not watched: unknown, not zero
    builder.generation_watched = True
    assert builder.end_step().generate_s == 0.0
    builder.mark(GEN_START)
    builder.mark(GEN_END)
    assert builder.end_step().generate_s is not None


def test_only_a_run_that_generates_shows_the_phase_in_its_series_and_bar() -> None:
    from pitstop.report.terminal import breakdown_bar

    plain = profile(framework="trl")
    assert Phase.GENERATE not in step_series(plain.ranks[0]).phases
    assert "generate" not in breakdown_bar(diagnose(plain)).plain
    assert diagnose(plain).metrics.generate_frac is None
    rl = rl_profile(gen=0.8)
    series = step_series(rl.ranks[0])
    assert series.phases[Phase.GENERATE] == pytest.approx([0.8] * 12)
    assert series.phases[Phase.OTHER] == pytest.approx([0.2 / 8] * 12)  # what the timed parts leave
    bar = breakdown_bar(diagnose(rl)).plain
    assert "generate 80%" in bar and bar.index("data") < bar.index("generate") < bar.index("forward")


# -- the generation watch -----------------------------------------------------------------------------


class _Listener:
    def guard(self, fn: Any, *args: Any) -> None:
        fn(*args)


def test_the_watch_counts_the_outermost_call_once_and_hands_every_call_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from pitstop.probe.collectors.generation import install_generation_watch
    from pitstop.probe.hooks import Hooks

    class Model:
        def generate(self, input_ids: Any, max_new_tokens: int = 3) -> Any:
            return torch.cat(
                [input_ids, torch.zeros(input_ids.shape[0], max_new_tokens, dtype=torch.long)], 1
            )

    class Engine:
        def generate(self, prompts: list[list[int]], n: int) -> Any:
            inner = Model().generate(torch.ones(1, 2, dtype=torch.long))  # nested: one call, not two
            return prompts, [[1] * (len(p) + int(inner.shape[1])) for p in prompts for _ in range(n)], None

    module = types.ModuleType("fake_generation_module")
    module.Model, module.Engine = Model, Engine  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_generation_module", module)
    hooks = Hooks(_Listener())  # type: ignore[arg-type]
    hooks.active = True
    starts: list[bool] = []
    ends: list[tuple[str, tuple[int, int] | None]] = []
    targets = (
        ("fake_generation_module", "Model", "generate", "transformers generate"),
        ("fake_generation_module", "Engine", "generate", "vLLM generate (TRL)"),
        ("not_imported_module", "X", "generate", "vLLM generate"),
    )
    wrapped = install_generation_watch(
        hooks, lambda: starts.append(True) or True, lambda label, s, made: ends.append((label, made)), targets
    )
    try:
        assert wrapped == ["transformers generate", "vLLM generate (TRL)"]
        out = Model().generate(torch.ones(4, 5, dtype=torch.long), max_new_tokens=7)
        assert tuple(out.shape) == (4, 12)  # the job's result, unchanged
        completions = Engine().generate([[1, 2], [3]], n=2)[1]
        assert len(completions) == 4
    finally:
        hooks.remove()
    assert ends == [("transformers generate", (4, 28)), ("vLLM generate (TRL)", (4, 2 * 7 + 2 * 6))]
    assert (
        len(starts) == 2
        and Model.generate.__name__ == "generate"
        and not hasattr(Model.generate, "__wrapped__")
    )


def test_the_settings_are_read_from_a_real_grpo_config_and_online_trainers_are_recognised(
    tmp_path: Any,
) -> None:
    from trl import GRPOConfig

    from pitstop.probe.collectors.generation import online_trainer, rl_settings

    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=96,
        use_cpu=True, report_to=[],
    )  # fmt: skip
    GRPOTrainer = type("GRPOTrainer", (), {})
    trainer = GRPOTrainer()
    trainer.args = args  # type: ignore[attr-defined]
    assert online_trainer(trainer)
    settings = rl_settings(trainer)
    assert settings == RlSettings(
        trainer="GRPOTrainer", use_vllm=False, vllm_mode=None, vllm_gpu_memory_utilization=None,
        continuous_batching=False, num_generations=4, generation_batch_size=4, steps_per_generation=1,
        num_iterations=1, max_completion_length=96,
    )  # fmt: skip
    sft = type("SFTTrainer", (), {})()
    sft.args = SimpleNamespace(packing=False)  # type: ignore[attr-defined]
    assert not online_trainer(sft) and not online_trainer(None)


# -- the remedy -----------------------------------------------------------------------------------------


def test_the_advice_names_the_trainers_config_and_tune_does_not_try_it() -> None:
    remedy = REGISTRY[RemedyId.FASTER_GENERATION]
    advice = remedy.advice(Framework.TRL, {"trainer": "RLOOTrainer", "num_generations": 4})
    assert "config = RLOOConfig(" in advice.snippet and 'vllm_mode="colocate"' in advice.snippet
    assert "trl vllm-serve" in advice.snippet and "num_generations=4" in advice.text
    assert "LLM(" in remedy.advice(Framework.PYTORCH, {}).snippet
    facts = TrialFacts(on_gpu=True, hf_model=True, framework=Framework.TRL, examples_are_text=True)
    assert not remedy.tunable and "GPU" in (remedy.cannot_try(facts) or "")
    assert not remedy.preserves_computation
