"""reentrant_checkpointing: the rule on hand-made profiles (fires only where the reentrant recompute repeats FSDP
all-gathers, prices them at the window's median all-gather, a configuration alone on a resharding FSDP run
with low confidence; defers to needless_recompute's bigger fix), the collector on real checkpoint calls (which
variant ran, whichever way the call was bound; which callables run a whole FSDP unit), and the remedy's trial
hooks: every call runs non-reentrant with the same gradients, a Trainer's kwargs say so, a reentrant run that
slipped through revokes the fix."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
from tests.factories import profile, steps

from pitstop.core.profile import Checkpointing, CollectiveRecord, RankProfile, RunProfile
from pitstop.core.vocabulary import CauseId, RemedyId, Severity
from pitstop.diagnose import diagnose

SITE = "torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py:164"


def _live(ck: Checkpointing, gathers_per_step: int = 13, gather_s: float | None = 0.02) -> RunProfile:
    """Ten 0.5 s steps on two ranks, each step's all-gathers taking ``gather_s`` (None: not timed)."""
    p = profile("cpu", steps(n=10, wall=0.5), ranks=2)
    for rank in p.ranks:
        rank.checkpointing = ck
        t, seq = 0.0, 0
        for s in rank.steps:
            for _ in range(gathers_per_step):
                done = None if gather_s is None else t + gather_s
                rank.collectives.append(
                    CollectiveRecord(s.index, "all_gather", "0,1", seq, 10_000_000, 2, t, done)
                )
                seq += 1
                t += 0.03
    return p


def _finding(p: RunProfile):  # type: ignore[no-untyped-def]
    return next((f for f in diagnose(p).findings if f.cause == CauseId.REENTRANT_CHECKPOINTING), None)


def test_repeated_all_gathers_are_counted_priced_and_fixed_by_the_non_reentrant_variant() -> None:
    f = _finding(_live(Checkpointing(reentrant=40, regathers=40, site=SITE)))
    assert f is not None and f.title == "Reentrant checkpointing all-gathers each FSDP unit twice"
    ev = f.evidence
    assert ev["repeated_all_gathers_per_step"] == 4 and ev["all_gathers_per_step"] == 13
    assert ev["reentrant_calls"] == 40 and ev["checkpoint_called_from"] == SITE
    assert ev["median_all_gather_ms"] == 20 and ev["repeated_share"] == pytest.approx(0.16)
    assert f.est_speedup == pytest.approx(1 / 0.84) and f.confidence == 0.8 and f.severity == Severity.MEDIUM
    assert "4.0 extra all-gathers a step on top of 9.0" in f.summary
    assert f.fix.uses[0].remedy == RemedyId.NON_REENTRANT_CHECKPOINTING
    assert "CheckpointImpl.REENTRANT" in f.fix.text  # what the job wrote, read from the calling line
    assert "CheckpointImpl.NO_REENTRANT" in f.fix.snippets["pytorch"]
    assert '"use_reentrant": False' in f.fix.snippets["hf_trainer"]


def test_reentrant_that_repeats_nothing_and_the_non_reentrant_variant_are_not_named() -> None:
    # one process, or the checkpoint inside each unit: the reentrant variant measured no slower
    assert _finding(_live(Checkpointing(reentrant=40, regathers=0), gathers_per_step=9)) is None
    assert _finding(_live(Checkpointing(non_reentrant=40), gathers_per_step=9)) is None
    assert _finding(profile("cpu", steps(n=10), gradient_checkpointing=True)) is None  # not watched


def test_untimed_all_gathers_leave_the_repeats_named_without_an_estimate() -> None:
    f = _finding(_live(Checkpointing(reentrant=40, regathers=40), gather_s=None))
    assert f is not None and f.est_speedup is None and f.confidence == 0.6
    assert "not estimated" in f.speedup_basis


def test_a_configuration_alone_is_named_on_a_resharding_fsdp_run_with_low_confidence() -> None:
    def configured(**env: Any) -> RunProfile:
        return profile("cuda", steps(n=10), gradient_checkpointing=True, checkpoint_reentrant=True, **env)

    f = _finding(configured(fsdp_sharding="full_shard"))
    assert f is not None and f.confidence == 0.35 and f.est_speedup is None and f.severity == Severity.LOW
    assert f.evidence["fsdp_sharding"] == "full_shard" and "not estimated" in f.speedup_basis
    assert _finding(configured(fsdp_sharding="shard_grad_op")) is None  # no gather in the backward to repeat
    assert _finding(configured()) is None  # no FSDP: nothing repeated


def test_when_checkpointing_is_not_needed_at_all_the_advice_says_that_is_the_bigger_fix() -> None:
    p = _live(Checkpointing(reentrant=40, regathers=40, site=SITE))
    for rank in p.ranks:
        rank.environment.gradient_checkpointing = True
        rank.steps = steps(n=10, wall=0.5, fwd=0.1, bwd=0.39)  # a backward with room for a recompute
    found = {f.cause: f for f in diagnose(p).findings}
    assert CauseId.NEEDLESS_RECOMPUTE in found
    assert (
        "turning activation checkpointing off altogether" in found[CauseId.REENTRANT_CHECKPOINTING].fix.text
    )


def test_the_record_survives_the_document_round_trip() -> None:
    p = _live(Checkpointing(reentrant=40, non_reentrant=2, regathers=40, site=SITE))
    back = RunProfile.from_dict(json.loads(json.dumps(p.to_dict())))
    assert back.ranks[0].checkpointing == p.ranks[0].checkpointing


# -- the collector and the remedy, on real torch ------------------------------------------------------------
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


class Block(torch.nn.Module):  # type: ignore[name-defined]
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: Any) -> Any:
        return self.b(torch.relu(self.a(x)))


def _probe_run(job_step) -> RankProfile:  # type: ignore[no-untyped-def]
    """A probe whose only patches are the recompute collector's, around a job that checkpoints for real."""
    from tests.unit.test_probe_collectors import Job

    from pitstop.probe.collectors.recompute import RecomputeCollector
    from pitstop.probe.config import ProbeConfig
    from pitstop.probe.probe import Probe

    done: list[RankProfile] = []
    probe = Probe(ProbeConfig(warmup=2, steps=4, announce=False), on_done=done.append)
    next(c for c in probe.collectors if isinstance(c, RecomputeCollector)).install()
    probe.hooks.active = True
    try:
        job = Job(probe)
        for step in range(8):
            job_step(step)
            job.run(1)
    finally:
        probe.hooks.remove()
    import torch.utils.checkpoint as ckpt

    assert not hasattr(ckpt._checkpoint_without_reentrant_generator, "__wrapped__")  # torch's own again
    assert done
    return done[0]


def _step(fn: Any, **kwargs: Any) -> None:
    from torch.utils.checkpoint import checkpoint

    x = torch.randn(2, 8, requires_grad=True)
    checkpoint(fn, x, **kwargs).sum().backward()  # the line the collector names


def test_the_collector_counts_the_variant_that_ran_and_where_it_was_asked_for() -> None:
    block = Block()
    line = next(
        i
        for i, text in enumerate(Path(__file__).read_text().splitlines(), 1)
        if "the line the collector" in text
    )
    rank = _probe_run(lambda i: _step(block, use_reentrant=i % 2 == 0))
    ck = rank.checkpointing
    assert ck is not None and ck.reentrant == 2 and ck.non_reentrant == 2 and ck.regathers == 0
    assert ck.site == f"{__file__}:{line}"
    assert rank.environment.checkpoint_reentrant is True and rank.environment.gradient_checkpointing is True
    plain = _probe_run(lambda i: _step(block, use_reentrant=False))
    assert plain.checkpointing is not None and plain.checkpointing.reentrant == 0
    assert plain.environment.checkpoint_reentrant is False


def test_transformers_checkpointing_is_seen_as_it_runs_reentrant() -> None:
    pytest.importorskip("transformers")
    from tests.scripts.common import tiny_llama

    model = tiny_llama("sdpa", hidden=32, layers=2)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.train()
    batch = torch.randint(3, 500, (1, 8))
    rank = _probe_run(lambda i: model(input_ids=batch, labels=batch).loss.backward())
    ck = rank.checkpointing
    assert ck is not None and ck.reentrant == 2 * 4 and ck.regathers == 0  # 2 layers, 4 measured steps
    assert ck.site is not None and ck.site.startswith("transformers/modeling_layers.py:")


@pytest.fixture
def one_rank() -> Any:
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_which_callables_run_a_whole_fsdp_unit(one_rank: Any) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.fsdp import FullyShardedDataParallel

    from pitstop.probe.collectors.recompute import called_module, fsdp_regathers

    unit = FullyShardedDataParallel(Block(), device_id=torch.device("cpu"))
    plain = Block()
    assert called_module(unit) == (unit, True)
    assert called_module(unit.__call__) == (unit, True)
    assert called_module(functools.partial(unit.__call__, scale=1)) == (unit, True)
    assert called_module(unit.forward) == (unit, False)
    hooks_outside = functools.partial(Block.forward, plain)  # Transformers 5's layer checkpoint
    assert called_module(hooks_outside) is None
    assert called_module(lambda x: x) is None
    wrapper = CheckpointWrapper(unit)

    def packed(*inputs: Any) -> Any:  # checkpoint_wrapper's kwargs-packing closure holds the wrapper
        return wrapper._checkpoint_wrapped_module(*inputs)

    assert called_module(packed) == (wrapper, True)
    # one rank: FSDP shards nothing (NO_SHARD), so a recompute gathers nothing again; two ranks: the slow test
    assert fsdp_regathers(wrapper, True) == 0 and fsdp_regathers(plain, True) == 0
    rank = _probe_run(lambda i: _step(unit, use_reentrant=True))
    assert rank.checkpointing is not None and rank.checkpointing.reentrant == 4
    assert rank.checkpointing.regathers == 0


@pytest.mark.slow
def test_two_ranks_count_the_repeats_fsdp_makes() -> None:
    """FSDP1 and FSDP2 on two gloo ranks: the repeats the collector counts are the all-gathers FSDP adds."""
    import subprocess
    import sys

    script = Path(__file__).parents[1] / "scripts" / "fsdp_regathers.py"
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=True
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # per step: the repeats the collector counted, and the all-gathers FSDP ran, reentrant and not
    assert seen["fsdp1 around the unit"] == {"reentrant": [4, 13], "non_reentrant": [0, 9]}
    assert seen["fsdp1, transformers' checkpoint"] == {"reentrant": [0, 9], "non_reentrant": [0, 9]}
    assert seen["fsdp2 around the unit"] == {"reentrant": [0, 9], "non_reentrant": [0, 9]}
    assert seen["fsdp2 around the unit, forward prefetch"] == {"reentrant": [3, 12], "non_reentrant": [0, 9]}


def _grads(model: Any, use_reentrant: bool | None) -> list[Any]:
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model.zero_grad()
    x = torch.randn(4, 8, requires_grad=True)
    kwargs: dict[str, Any] = {} if use_reentrant is None else {"use_reentrant": use_reentrant}
    checkpoint(model, x, **kwargs).pow(2).sum().backward()
    return [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]


def test_the_trial_runs_every_call_non_reentrant_with_the_same_gradients(tmp_path: Any) -> None:
    import torch.utils.checkpoint as ckpt
    from torch.optim import optimizer as optim_mod

    from pitstop.remedies import remedy
    from pitstop.trials.request import FixReport, FixRequest

    model = Block()
    reference = _grads(model, True)
    fix = remedy(RemedyId.NON_REENTRANT_CHECKPOINTING)
    report = FixReport(tmp_path / "fixes.json")
    original, forward = ckpt.checkpoint, vars(ckpt.CheckpointFunction)["forward"]
    hooks = dict(optim_mod._global_optimizer_pre_hooks)
    try:
        fix.on_import()["torch.utils.checkpoint"](ckpt, FixRequest(), report)
        for use_reentrant in (True, None):  # asked for, or left to torch's default
            got = _grads(model, use_reentrant)
            assert all(torch.equal(a, b) for a, b in zip(got, reference, strict=True))
        assert (
            "use_reentrant=True run as use_reentrant=False"
            in report.applied[RemedyId.NON_REENTRANT_CHECKPOINTING]
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ckpt.CheckpointFunction.apply(model, True, torch.randn(2, 8, requires_grad=True)).sum().backward()
        opt.step()  # a reentrant run slipped through (CheckpointFunction called directly): revoked
        assert "still ran reentrant" in report.revoked[RemedyId.NON_REENTRANT_CHECKPOINTING]
    finally:
        ckpt.checkpoint = original
        ckpt.CheckpointFunction.forward = forward  # type: ignore[method-assign]
        optim_mod._global_optimizer_pre_hooks.clear()
        optim_mod._global_optimizer_pre_hooks.update(hooks)


def test_a_trainers_checkpointing_kwargs_are_rewritten_non_reentrant(tmp_path: Any) -> None:
    pytest.importorskip("transformers")
    from transformers import TrainingArguments, training_args

    from pitstop.remedies.arming import patch_training_arguments
    from pitstop.trials.request import FixReport, FixRequest

    report = FixReport(tmp_path / "fixes.json")
    request = FixRequest(fixes=frozenset({str(RemedyId.NON_REENTRANT_CHECKPOINTING)}))
    original = TrainingArguments.__post_init__
    try:
        patch_training_arguments(training_args, request, report)
        args = TrainingArguments(
            output_dir=str(tmp_path),
            gradient_checkpointing=True,
            gradient_checkpointing_kwargs={"use_reentrant": True},
        )
        assert args.activation_checkpointing_kwargs == {"use_reentrant": False}
        assert RemedyId.NON_REENTRANT_CHECKPOINTING in report.applied
        off = TrainingArguments(output_dir=str(tmp_path))  # no checkpointing: left as it was
        assert off.activation_checkpointing_kwargs is None
    finally:
        TrainingArguments.__post_init__ = original  # type: ignore[method-assign]
