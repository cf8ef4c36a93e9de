"""moe_experts_loop: the rule on hand-made profiles (fires on a loop whose experts take a material share of the
step, with the timed switch or the assumed factor; silent with grouped_mm, for a dense model, under the share;
from a config or an old Transformers at a low confidence without an estimate), the record's JSON round trip, a
training config's experts_implementation, the advice per case, and on a real tiny Mixtral / Qwen2-MoE from
Transformers: both implementations compute the same logits and gradients, the collector times the experts and
the switch, and the trial hook switches the model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from tests.factories import profile, steps

from pitstop.core.findings import Finding
from pitstop.core.profile import (
    Environment,
    ExpertsInfo,
    ModelInfo,
    RankProfile,
    RunProfile,
    from_jsonable,
    to_jsonable,
)
from pitstop.core.vocabulary import CauseId, Device, Framework, RemedyId, Severity
from pitstop.diagnose.causes import moe_experts_loop as rule
from pitstop.diagnose.context import RuleContext
from pitstop.remedies import remedy
from pitstop.trials.request import FixReport, FixRequest

SITE = "MixtralExperts (transformers.models.mixtral.modeling_mixtral)"


def _info(**kw: Any) -> ExpertsInfo:
    """Eager experts taking 0.6 s of 10 steps of 0.1 s; one call's loop 20 ms against grouped_mm 4 ms."""
    base: dict[str, Any] = dict(
        layers=2,
        experts=32,
        experts_per_token=2,
        implementation="eager",
        available=["eager", "batched_mm", "grouped_mm"],
        site=SITE,
        library="transformers",
        transformers_version="5.25.0",
        calls=20,
        forward_s=0.2,
        backward_s=0.4,
        backward_calls=20,
        experts_s=0.6,
        tokens_per_call=512,
        loop_s=0.020,
        grouped_s=0.004,
        timed_tokens=512,
        timed_dtype="float32",
    )
    return ExpertsInfo(**{**base, **kw})


def _with(info: ExpertsInfo | None, source: str = "doctor", **env: Any) -> RunProfile:
    p = profile("cpu", steps(n=10, wall=0.1), **env)
    p.source = source  # type: ignore[assignment]
    p.ranks[0].experts = info
    return p


def _finding(p: RunProfile) -> Finding | None:
    return rule.moe_experts_loop(RuleContext.of(p))


def test_an_eager_loop_is_named_with_its_share_and_the_timed_switch() -> None:
    f = _finding(_with(_info()))
    assert f is not None and f.cause == CauseId.MOE_EXPERTS_LOOP
    ev = f.evidence
    assert ev["implementation"] == "eager" and ev["experts"] == 32 and ev["experts_per_token"] == 2
    assert ev["layers"] == 2 and ev["experts_share"] == pytest.approx(0.6)
    assert ev["grouped_speedup"] == pytest.approx(5.0) and ev["loop_ms_per_call"] == pytest.approx(20.0)
    # 60% of the step made 5× faster: 1 / (0.4 + 0.12)
    assert f.est_speedup == pytest.approx(1 / 0.52, rel=1e-3)
    assert f.confidence == rule.LIVE_CONFIDENCE and f.severity == Severity.HIGH
    assert "grouped_mm" in f.speedup_basis and "20.00 ms" in f.speedup_basis
    assert 'experts_implementation="eager"' in f.summary
    assert f.fix.uses[0].remedy == RemedyId.GROUPED_EXPERTS
    assert 'experts_implementation="grouped_mm"' in f.fix.snippet


def test_grouped_experts_a_dense_model_and_a_small_share_are_silent() -> None:
    assert _finding(_with(_info(implementation="grouped_mm", loop_s=None, grouped_s=None))) is None
    assert _finding(_with(None)) is None  # the probe looked and found no expert layer
    assert _finding(_with(_info(experts_s=0.05))) is None  # 5% of the step: under MIN_SHARE
    # the grouped kernel measured no faster on this device: no gain to report
    assert _finding(_with(_info(loop_s=0.004, grouped_s=0.004))) is None


def test_a_hand_written_loop_or_a_fallback_uses_the_assumed_factor() -> None:
    looped = _info(
        implementation="loop", site="LoopedMoe (__main__)", library=None, loop_s=None, grouped_s=None
    )
    f = _finding(_with(looped))
    assert f is not None and f.confidence == rule.ASSUMED_CONFIDENCE
    assert f.est_speedup == pytest.approx(1 / (0.4 + 0.6 / rule.GROUPED_SPEEDUP), rel=1e-3)
    assert "nn.ModuleList" in f.summary and "taken as ×3" in f.speedup_basis
    assert "grouped_mm" in f.fix.text and "ModuleList" in f.fix.text
    why = "this GPU's compute capability 7.0 is below 8.0 (grouped_mm needs Ampere or newer)"
    fallback = _info(implementation="grouped_mm", fallback=why)
    f = _finding(_with(fallback))
    assert f is not None and f.evidence["fallback"] == why and why in f.summary
    assert f.evidence["grouped_speedup"] == rule.GROUPED_SPEEDUP  # the timed fallback is not the fix's gain
    assert "torch >= 2.9" in f.fix.text


def test_a_compiled_model_is_named_without_an_estimate() -> None:
    f = _finding(_with(_info(forward_s=None, backward_s=None, experts_s=None, loop_s=None, grouped_s=None)))
    assert f is not None and f.est_speedup is None and f.confidence == rule.UNTIMED_CONFIDENCE
    assert f.speedup_basis.startswith("not estimated")


def test_from_a_config_or_an_old_transformers_at_a_low_confidence() -> None:
    moe = ModelInfo(model_type="mixtral", n_layers=32, n_experts=8, experts_active=2)
    p = _with(None, source="check", model=moe, experts_implementation="eager")
    p.ranks = []
    p.run_environment = p.run_environment or Environment()
    env = p.environment
    env.model, env.experts_implementation = moe, "eager"
    env.configured_by["experts_implementation"] = (
        "sft.json: model_init_kwargs: experts_implementation='eager'"
    )
    f = _finding(p)
    assert f is not None and f.confidence == rule.CONFIG_CONFIDENCE and f.est_speedup is None
    assert f.evidence["experts"] == 8 and "sft.json" in f.summary
    env.experts_implementation, env.versions = None, {"transformers": "4.57.1"}
    f = _finding(p)
    assert f is not None and f.evidence["implementation"] == "loop" and "4.57.1" in f.summary
    assert "transformers>=5" in f.fix.snippet
    env.versions = {"transformers": "5.25.0"}
    assert _finding(p) is None
    env.model, env.experts_implementation = ModelInfo(n_layers=16), "eager"  # a dense model: nothing loops
    assert _finding(p) is None


def test_the_record_survives_json() -> None:
    rank = RankProfile(experts=_info(fallback="x", recomputed=3))
    back = from_jsonable(RankProfile, json.loads(json.dumps(to_jsonable(rank))))
    assert back.experts == rank.experts
    env = from_jsonable(Environment, to_jsonable(Environment(experts_implementation="eager")))
    assert env.experts_implementation == "eager"


def test_a_training_config_asks_for_the_loop(tmp_path: Path) -> None:
    from pitstop.ingest.configs import read_config

    data = {"output_dir": "o", "per_device_train_batch_size": 2, "packing": True}
    facts = read_config(
        {**data, "model_init_kwargs": {"experts_implementation": "eager"}}, "hf_args", tmp_path / "sft.json"
    )
    assert facts.env.experts_implementation == "eager"
    assert "model_init_kwargs" in facts.env.configured_by["experts_implementation"]
    assert read_config(data, "hf_args", tmp_path / "sft.json").env.experts_implementation is None


def test_the_advice_per_case() -> None:
    r = remedy(RemedyId.GROUPED_EXPERTS)
    trl = r.advice(Framework.TRL, {"implementation": "eager", "library": "transformers"})
    assert "model_init_kwargs" in trl.snippet and '"grouped_mm"' in trl.snippet
    remote = r.advice(Framework.PYTORCH, {"implementation": "loop", "library": "remote code"})
    assert "trust_remote_code" in remote.text + remote.snippet
    assert r.preserves_computation and r.tunable and r.tune_rank is not None


# -- a real tiny MoE from Transformers ---------------------------------------------------------------------


def _tiny(kind: str, implementation: str) -> Any:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    common = dict(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        num_experts_per_tok=2,
        use_cache=False,
    )
    torch.manual_seed(0)
    if kind == "mixtral":
        config = transformers.MixtralConfig(num_local_experts=16, intermediate_size=96, **common)
        return transformers.MixtralForCausalLM._from_config(config, experts_implementation=implementation)
    config = transformers.Qwen2MoeConfig(
        num_experts=16,
        moe_intermediate_size=48,
        shared_expert_intermediate_size=96,
        intermediate_size=96,
        **common,
    )
    return transformers.Qwen2MoeForCausalLM._from_config(config, experts_implementation=implementation)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_grouped_experts_compute_what_the_loop_computes(kind: str) -> None:
    """The remedy preserves the computation: the same logits, loss and expert gradients within fp32 rounding."""
    import torch

    model = _tiny(kind, "eager")
    batch = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1))
    seen = {}
    for implementation in ("eager", "grouped_mm"):
        model.set_experts_implementation(implementation)
        assert model.config._experts_implementation == implementation
        model.zero_grad()
        out = model(input_ids=batch, labels=batch)
        out.loss.backward()
        grads = [p.grad.clone() for n, p in model.named_parameters() if ".experts." in n]
        seen[implementation] = (out.logits.detach(), out.loss.item(), grads)
    (l0, loss0, g0), (l1, loss1, g1) = seen["eager"], seen["grouped_mm"]
    assert torch.allclose(l0, l1, atol=1e-5, rtol=1e-5) and loss0 == pytest.approx(loss1, rel=1e-6)
    assert g0 and all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(g0, g1, strict=True))


def test_transformers_defaults_to_grouped_mm() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        num_local_experts=4, intermediate_size=32,
    )  # fmt: skip
    assert transformers.MixtralForCausalLM(config).config._experts_implementation == "grouped_mm"


def _collect(model: Any, steps_run: int = 3) -> tuple[ExpertsInfo | None, list[str]]:
    import torch

    from pitstop.probe.collectors.base import ProbeContext
    from pitstop.probe.collectors.experts import ExpertsCollector

    errors: list[str] = []
    ctx = ProbeContext(
        config=None,  # type: ignore[arg-type]
        origin=0.0,
        hooks=None,  # type: ignore[arg-type]
        errors=errors,
        disable=lambda exc: None,
        step_index=lambda: 1,
    )
    ctx.model, ctx.device = model, torch.device("cpu")
    ctx.environment = Environment(device=Device.CPU, model=ModelInfo(n_experts=16, experts_active=2))
    collector = ExpertsCollector(ctx)
    collector.begin()
    batch = torch.randint(0, 256, (4, 32))
    model(input_ids=batch, labels=batch).loss.backward()  # before the window: not counted
    collector.start_window()
    for _ in range(steps_run):
        model(input_ids=batch, labels=batch).loss.backward()
    collector.stop_window()
    collector.closing()
    draft = RankProfile()
    collector.fill(draft)
    return draft.experts, errors


@pytest.mark.slow
def test_the_collector_times_the_experts_and_the_switch() -> None:
    model = _tiny("mixtral", "eager")
    info, errors = _collect(model)
    assert errors == [] and info is not None
    assert info.implementation == "eager" and info.library == "transformers" and info.fallback is None
    assert info.layers == 2 and info.experts == 16 and info.experts_per_token == 2
    assert info.calls == 6 and info.backward_calls == 6 and info.recomputed == 0  # 2 layers × 3 steps
    assert (
        info.forward_s
        and info.backward_s
        and info.experts_s == pytest.approx(info.forward_s + info.backward_s)
    )
    assert info.tokens_per_call == 4 * 32 and "grouped_mm" in info.available
    assert info.loop_s and info.grouped_s and info.timed_tokens == 128 and info.timed_dtype == "float32"
    # the timing returned its gradients: the job's own are those of its last backward, untouched
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.slow
def test_the_collector_on_grouped_experts_and_on_a_checkpointed_model() -> None:
    grouped, errors = _collect(_tiny("qwen2_moe", "grouped_mm"))
    assert errors == [] and grouped is not None
    assert grouped.implementation == "grouped_mm" and grouped.fallback is None
    assert grouped.loop_s is None  # nothing to switch: nothing timed after the window
    model = _tiny("mixtral", "eager")
    # reentrant checkpointing: the forward runs without grad, again in the backward (timed there, not counted
    # twice); the non-reentrant recompute in torch 2.13 runs no module hooks, its time falls in the backward
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    model.train()
    info, errors = _collect(model)
    assert errors == [] and info is not None
    assert info.calls == 6 and info.recomputed == 6 and info.backward_calls == 6


def test_a_dense_model_has_no_experts() -> None:
    torch = pytest.importorskip("torch")
    from pitstop.probe.collectors.experts import expert_modules

    assert expert_modules(torch.nn.Sequential(torch.nn.Linear(4, 4))) == []


def test_the_trial_switches_the_model_once() -> None:
    model = _tiny("mixtral", "eager")
    fix = remedy(RemedyId.GROUPED_EXPERTS)
    report = FixReport(None)
    fix.on_first_forward(model, FixRequest(), report)
    assert report.applied[RemedyId.GROUPED_EXPERTS] == "MixtralForCausalLM: experts eager → grouped_mm"
    assert model.config._experts_implementation == "grouped_mm"
    again = FixReport(None)
    fix.on_first_forward(model, FixRequest(), again)
    assert "already runs grouped_mm" in again.skipped[RemedyId.GROUPED_EXPERTS]
    dense = FixReport(None)
    fix.on_first_forward(dataclasses.replace(ModelInfo()), FixRequest(), dense)
    assert RemedyId.GROUPED_EXPERTS in dense.skipped
