"""ddp_find_unused: the rule on hand-made profiles (fires only while the search runs and every parameter was used
on every rank; from a config alone at a low confidence, with no estimate), the advice per framework, the trial
patch on a subclass of DDP, who asked for the search read off a stack, and the collector on a real one-rank gloo
DDP driven through the probe's listener calls."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType, SimpleNamespace
from typing import Any

import pytest
from tests.factories import profile, steps

from pitstop.core.profile import DdpSettings, RankProfile, RunProfile
from pitstop.core.vocabulary import CauseId, Framework, RemedyId, Severity
from pitstop.diagnose import diagnose
from pitstop.diagnose.document import read_run
from pitstop.remedies import REGISTRY
from pitstop.trials.request import FixReport, FixRequest

SITE = "train.py:42"
TRAINER_DEFAULT = (
    "the Trainer's default (ddp_find_unused_parameters=None: on unless the model is a PreTrainedModel with "
    "gradient checkpointing)"
)


def _with(*settings: DdpSettings, source: str = "doctor") -> RunProfile:
    p = profile("cpu", steps(n=10, wall=0.1), ranks=len(settings))
    p.source = source  # type: ignore[assignment]
    for rank, ddp in zip(p.ranks, settings, strict=True):
        rank.ddp = ddp
    return p


def _searching(unused: int | None = 0, search_s: float | None = 0.05, **kw: Any) -> DdpSettings:
    """A wrapper that searched in 10 steps of 0.1 s: 5 ms of each step by default."""
    base: dict[str, Any] = dict(
        find_unused_parameters=True,
        static_graph=False,
        parameters=20,
        unused_parameters=unused,
        set_by=TRAINER_DEFAULT,
        site=SITE,
        search_s=search_s,
        searches=10,
    )
    return DdpSettings(**{**base, **kw})


def _finding(p: RunProfile):  # type: ignore[no-untyped-def]
    return next((f for f in diagnose(p).findings if f.cause == CauseId.DDP_FIND_UNUSED), None)


def test_a_search_that_finds_nothing_is_named_with_who_set_it_and_its_measured_cost() -> None:
    f = _finding(_with(_searching(), _searching(search_s=0.03)))
    assert f is not None and f.title == "DDP searches for unused parameters that do not exist"
    ev = f.evidence
    assert ev["unused_parameters"] == 0 and ev["parameters"] == 20 and ev["ranks_searching"] == 2
    assert ev["set_by"] == TRAINER_DEFAULT and ev["site"] == SITE
    assert ev["search_ms_per_step"] == pytest.approx(4.0)  # (5 ms + 3 ms) / 2 of 100 ms steps
    assert f.est_speedup == pytest.approx(1 / (1 - 0.04), rel=1e-3)
    assert "not included" in f.speedup_basis and f.confidence == 0.9 and f.severity == Severity.LOW
    assert TRAINER_DEFAULT in f.summary and SITE in f.summary and SITE in f.fix.text
    assert f.fix.uses[0].remedy == RemedyId.NO_UNUSED_SEARCH
    assert "ddp_find_unused_parameters=False" in f.fix.snippets["hf_trainer"]
    assert 'strategy="ddp"' in f.fix.snippets["lightning"]
    assert "DistributedDataParallelKwargs(find_unused_parameters=False)" in f.fix.snippets["accelerate"]
    assert "find_unused_parameters=False" in f.fix.snippets["pytorch"]


def test_a_parameter_unused_on_any_rank_makes_the_search_needed() -> None:
    assert _finding(_with(_searching(), _searching(unused=2))) is None
    assert _finding(_with(_searching(unused=1))) is None


def test_no_search_no_finding() -> None:
    assert _finding(_with(_searching(find_unused_parameters=False, search_s=None))) is None
    assert _finding(_with(_searching(static_graph=True))) is None  # the graph is searched once, not each step


def test_uncounted_usage_is_not_a_probes_finding_since_tunes_fix_could_stop_the_job() -> None:
    assert _finding(_with(_searching(unused=None))) is None


def test_other_sources_name_the_search_at_a_lower_confidence() -> None:
    sampled = _searching(
        unused=None, set_by="sampled stacks: DDP's post-forward search (3 samples)", site=None
    )
    f = _finding(_with(sampled, source="attach"))  # the search caught running; parameters not counted
    assert f is not None and f.confidence == 0.45 and f.evidence["unused_parameters"] is None
    assert "not known" in f.summary and f.est_speedup is not None  # the samples' time is still the search's
    logged = profile("cpu", [], world_size=2)  # a log: DDP's warning that no parameter went unused, no steps
    logged.source = "analyze"  # type: ignore[assignment]
    logged.ranks[0].ddp = DdpSettings(
        find_unused_parameters=True, unused_parameters=0, set_by="DDP's own warning in the log"
    )
    f = _finding(logged)
    assert (
        f is not None
        and f.confidence == 0.6
        and f.est_speedup is None
        and f.evidence["unused_parameters"] == 0
    )
    assert "DDP's own warning in the log" in f.summary


def test_an_unmeasured_search_is_still_named_without_an_estimate() -> None:
    f = _finding(_with(_searching(search_s=None)))
    assert f is not None and f.est_speedup is None and "not estimated" in f.speedup_basis
    assert f.severity == Severity.MEDIUM


def test_a_config_alone_is_a_low_confidence_finding_with_its_source() -> None:
    p = profile("cpu", ddp_find_unused_parameters=True, config_sources=["args.json"], world_size=None)
    p.source = "analyze"  # type: ignore[assignment]
    f = _finding(p)
    assert f is not None and f.confidence == 0.35 and f.severity == Severity.LOW  # capped by its confidence
    assert f.est_speedup is None and "not estimated" in f.speedup_basis
    assert f.evidence["config_sources"] == ["args.json"] and "args.json" in f.summary
    said = "args.json: ddp_find_unused_parameters unset: the Trainer's default searches"
    p.environment.configured_by["ddp_find_unused_parameters"] = said
    f = _finding(p)
    assert f is not None and said in f.summary and f.evidence["set_by"] == said and said in f.fix.text
    one = profile("cpu", ddp_find_unused_parameters=True, world_size=1)
    one.source = "analyze"  # type: ignore[assignment]
    assert _finding(one) is None  # one process: no DDP to search
    off = profile("cpu", ddp_find_unused_parameters=False)
    off.source = "analyze"  # type: ignore[assignment]
    assert _finding(off) is None


def test_a_live_run_without_ddp_ignores_a_configured_setting() -> None:
    p = profile("cpu", steps(n=10), ddp_find_unused_parameters=True)
    p.source = "doctor"  # type: ignore[assignment]
    assert _finding(p) is None  # the probe watched: no wrapper, no search


def test_the_settings_survive_the_document_round_trip() -> None:
    p = _with(_searching(unused_names=["head.weight"]))
    back = RunProfile.from_dict(json.loads(json.dumps(p.to_dict())))
    assert back.ranks[0].ddp == p.ranks[0].ddp
    doc = json.loads(json.dumps(diagnose(p).to_dict()))
    assert [f.cause for f in read_run(doc).findings if f.cause == CauseId.DDP_FIND_UNUSED]


def test_the_advice_names_who_asked_and_where() -> None:
    remedy = REGISTRY[RemedyId.NO_UNUSED_SEARCH]
    advice = remedy.advice(Framework.PYTORCH, {"site": SITE, "set_by": "X", "parameters": 7})
    assert (
        "asked for by X; the wrapper built at train.py:42" in advice.text
        and "all 7 parameters" in advice.text
    )
    assert remedy.tunable and remedy.preserves_computation and remedy.tune_rank is not None
    assert "SFTConfig(..., ddp_find_unused_parameters=False)" in remedy.advice(Framework.TRL, {}).snippet


# -- who asked for the search ------------------------------------------------------------------------------


def _through(module: str, cls: str, attrs: dict[str, Any]) -> FrameType:
    """The frame of a call made from a method of ``cls``, compiled as if it lay in ``module`` (a library):
    the walk reads only the frames' module names and their ``self``."""
    namespace: dict[str, Any] = {"__name__": module}
    source = f"class {cls}:\n    def run(self, fn):\n        return fn()\n"
    exec(compile(source, f"/lib/{module.replace('.', '/')}.py", "exec"), namespace)
    obj = namespace[cls]()
    vars(obj).update(attrs)
    frame: FrameType = obj.run(lambda: sys._getframe(0))
    return frame


def test_who_set_reads_the_trainer_the_strategy_or_the_accelerator_off_the_stack() -> None:
    from pitstop.probe.collectors.ddp import who_set

    class TrainingArguments(SimpleNamespace):
        pass

    default = _through(
        "transformers.trainer", "Trainer", {"args": TrainingArguments(ddp_find_unused_parameters=None)}
    )
    set_by, site = who_set(default, True)
    assert set_by == TRAINER_DEFAULT
    assert site is not None and site.startswith(f"{__file__}:")  # the first frame outside the libraries
    explicit = _through(
        "trl.trainer", "Trainer", {"args": TrainingArguments(ddp_find_unused_parameters=True)}
    )
    assert who_set(explicit, True)[0] == "TrainingArguments(ddp_find_unused_parameters=True)"
    strategy = _through("lightning.pytorch.strategies.ddp", "DDPStrategy", {})
    assert "Lightning's DDPStrategy(find_unused_parameters=True)" in str(who_set(strategy, True)[0])
    accelerator = _through("accelerate.accelerator", "Accelerator", {})
    assert (
        who_set(accelerator, True)[0]
        == "Accelerate's DistributedDataParallelKwargs(find_unused_parameters=True)"
    )
    assert who_set(sys._getframe(0), True)[0] == "DistributedDataParallel(find_unused_parameters=True)"
    assert who_set(default, False)[0] is None  # nobody asked for a search that is off


# -- the trial and the collector, on a real DDP -----------------------------------------------------------

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


@pytest.fixture(scope="module")
def world1(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if dist.is_initialized():  # another module's group: share it
        yield
        return
    store = tmp_path_factory.mktemp("world1") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Net(torch.nn.Module):
    def __init__(self, spare: bool = False) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 1)
        self.spare = torch.nn.Linear(4, 2) if spare else None  # trainable, never used

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(x))).sum()


def test_the_trial_builds_every_wrapper_without_the_search(world1: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    class Wrapper(DDP):  # patch a subclass: torch's class stays untouched
        pass

    remedy = REGISTRY[RemedyId.NO_UNUSED_SEARCH]
    report = FixReport(None)
    remedy.on_import()["torch.nn.parallel.distributed"](
        SimpleNamespace(DistributedDataParallel=Wrapper),  # type: ignore[arg-type]
        FixRequest(fixes=frozenset({"no_unused_search"})),
        report,
    )
    model = Wrapper(Net(), find_unused_parameters=True)
    assert model.find_unused_parameters is False
    assert "find_unused_parameters=False" in report.applied[RemedyId.NO_UNUSED_SEARCH]
    plain = Wrapper(Net())  # a wrapper that did not ask: built as it was
    assert plain.find_unused_parameters is False
    import inspect

    params = list(inspect.signature(DDP.__init__).parameters.values())[2:]  # after self and module
    upto = [p.name for p in params].index("find_unused_parameters")
    positional = [p.default for p in params[:upto]] + [True]  # the job passes it by position
    assert Wrapper(Net(), *positional).find_unused_parameters is False
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).backward()
    opt.step()  # the check at the first optimizer step finds the fix applied
    assert RemedyId.NO_UNUSED_SEARCH not in report.skipped


def _probe_run(build: Callable[[], Any], steps: int = 8, device: str = "cpu") -> DdpSettings | None:
    """A probe whose only patches are the DDP collector's, around a job that builds a DDP wrapper and trains
    it (forward, backward, optimizer step); the probe's steps come through the listener calls."""
    from tests.unit.test_probe_collectors import Job

    from pitstop.probe.collectors.ddp import DdpCollector
    from pitstop.probe.config import ProbeConfig
    from pitstop.probe.probe import Probe

    done: list[RankProfile] = []
    probe = Probe(ProbeConfig(warmup=2, steps=4, announce=False), on_done=done.append)
    next(c for c in probe.collectors if isinstance(c, DdpCollector)).install()
    probe.hooks.active = True
    try:
        model = build()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        job = Job(probe)
        for _ in range(steps):
            model(torch.ones(2, 4, device=device)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            job.run(1)
    finally:
        probe.hooks.remove()  # the probe removed it when its window ended; safe twice
    from torch.nn.parallel import DistributedDataParallel as DDP

    assert not hasattr(DDP._post_forward, "__wrapped__") and not hasattr(DDP._ddp_init_helper, "__wrapped__")
    assert done
    return done[0].ddp


def _line_of(text: str) -> int:
    return next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if text in line)


def test_the_collector_reads_the_search_its_cost_and_that_every_parameter_was_used(world1: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = _probe_run(lambda: DDP(Net(), find_unused_parameters=True))  # the job's line
    assert ddp is not None and ddp.find_unused_parameters is True and ddp.static_graph is False
    assert ddp.parameters == 4 and ddp.unused_parameters == 0 and ddp.unused_names == []
    assert ddp.set_by == "DistributedDataParallel(find_unused_parameters=True)"
    assert ddp.site == f"{__file__}:{_line_of('# the job' + chr(39) + 's line')}"
    assert ddp.searches == 4 and ddp.search_s is not None and ddp.search_s > 0


def test_the_collector_names_a_parameter_no_step_used(world1: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = _probe_run(lambda: DDP(Net(spare=True), find_unused_parameters=True))
    assert ddp is not None and ddp.parameters == 6
    assert ddp.unused_parameters == 2 and ddp.unused_names == ["spare.weight", "spare.bias"]


def test_the_collector_reads_a_wrapper_without_the_search_and_counts_nothing(world1: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = _probe_run(lambda: DDP(Net()))
    assert ddp is not None and ddp.find_unused_parameters is False
    assert ddp.unused_parameters is None and ddp.search_s is None and ddp.searches == 0 and ddp.set_by is None


def test_a_job_without_ddp_has_no_settings() -> None:
    assert _probe_run(lambda: Net(), steps=8) is None
