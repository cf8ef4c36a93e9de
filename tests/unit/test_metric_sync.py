"""metric_sync: the rule on hand-made two-rank profiles (the job's own line, a library setting, what is not a
metric, the configured fact alone), the remedy's advice and its Trainer trial, and the collectives
collector's issuing line with real torch.distributed calls (a one-rank gloo group): the job's line, nothing
inside backward, the line past a relaying library, nothing for torch's or DeepSpeed's own."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tests.factories import profile, steps

from pitstop.core.profile import CollectiveRecord, RunProfile
from pitstop.core.vocabulary import CauseId, Framework, RemedyId, Severity
from pitstop.diagnose import diagnose
from pitstop.diagnose.causes.metric_sync import MIN_SHARE, setting_of
from pitstop.diagnose.context import amdahl
from pitstop.diagnose.document import read_run
from pitstop.remedies import REGISTRY
from pitstop.remedies.base import TrialFacts
from pitstop.trials.request import FixReport, FixRequest

JOB_LINE = "/home/me/train.py:86 in main"
TOKENS_LINE = "transformers/trainer.py:2792 in Trainer._track_num_input_tokens"
ITEMS_LINE = "transformers/trainer.py:2387 in Trainer._get_num_items_in_batch"


def _two_ranks(
    per_step: int = 8,
    blocked: float = 0.002,
    site: str | None = JOB_LINE,
    via: str | None = None,
    every: int = 1,
    nbytes: int = 4,
    size: int = 2,
    clock: str = "host",
    n: int = 16,
    host_blocked: float | None = None,
) -> RunProfile:
    """Two ranks of 100 ms steps; each step DDP's bucket and broadcast, and ``per_step`` python collectives
    of ``nbytes`` from ``site`` in every ``every``-th step, each spanning ``blocked`` seconds (the host
    blocked as long, unless ``host_blocked`` says: a GPU's host that only queued it)."""
    host_blocked = blocked if host_blocked is None else host_blocked
    p = profile("cpu", steps(n=n, wall=0.1), ranks=2, world_size=2, framework="pytorch")
    for rank in p.ranks:
        seq = 0
        records = []
        for s in rank.steps:
            t = s.index * 0.1
            records.append(
                CollectiveRecord(s.index, "broadcast", "0,1", seq, 128, 2, t, t + 1e-4, 1e-4, "ddp", clock)
            )
            records.append(
                CollectiveRecord(
                    s.index, "all_reduce", "0,1", seq + 1, 4_000_000, 2, t + 0.05, t + 0.06, source="ddp"
                )
            )
            seq += 2
            if s.index % every:
                continue
            for k in range(per_step):
                at = t + 0.08 + k * blocked
                records.append(
                    CollectiveRecord(
                        s.index, "all_reduce", "0,1" if size == 2 else "0", seq, nbytes, size, at, at + blocked,
                        host_blocked, site=site, via=via, clock=clock,
                    )
                )  # fmt: skip
                seq += 1
        rank.collectives = records
    return p


def _finding(p: RunProfile):  # type: ignore[no-untyped-def]
    return next((f for f in diagnose(p).findings if f.cause == CauseId.METRIC_SYNC), None)


def test_the_jobs_own_reduce_every_step_is_found_with_its_line_and_blocked_time() -> None:
    f = _finding(_two_ranks())
    assert f is not None and f.title == "A metric gathered across ranks every step"
    ev = f.evidence
    (site,) = ev["sites"]
    assert site["site"] == JOB_LINE and site["setting"] is None and site["ops"] == ["all_reduce"]
    assert site["calls_per_step"] == 8 and site["steps_with"] == 16 and site["bytes_per_call"] == 4
    assert ev["blocked_ms_per_step"] == pytest.approx(16.0) and ev["blocked_frac_of_step"] == pytest.approx(
        0.16
    )
    assert f.est_speedup == pytest.approx(amdahl(0.16, float("inf")))
    assert f.severity == Severity.HIGH and f.confidence == 0.75 and ev["source"] == "live"
    assert JOB_LINE in f.summary and JOB_LINE in f.fix.text
    assert f.fix.uses[0].remedy == RemedyId.SYNC_METRICS_LESS
    assert "dist.all_reduce(running)" in f.fix.snippets["pytorch"]
    assert "no device stream" in f.speedup_basis  # a CPU run: what the estimate leaves out is said


def test_the_same_reduce_every_fifty_steps_is_not_a_finding() -> None:
    assert _finding(_two_ranks(every=50, n=60)) is None


def test_gradients_one_rank_and_lines_inside_backward_are_not_metrics() -> None:
    assert (
        _finding(_two_ranks(nbytes=4_000_000)) is None
    )  # a hand-written gradient average: MBs, not a metric
    assert _finding(_two_ranks(size=1)) is None  # a group of one rank: nobody to wait for
    assert _finding(_two_ranks(site=None)) is None  # inside backward, or torch's own: no line recorded
    assert (
        _finding(_two_ranks(site=ITEMS_LINE, via="accelerate:Accelerator.gather")) is None
    )  # feeds the loss


def test_a_cheap_reduce_of_the_jobs_own_is_not_flagged_but_a_known_setting_is_named() -> None:
    cheap = 0.2 * MIN_SHARE * 0.1  # a fifth of the threshold's blocked time, per step
    assert _finding(_two_ranks(per_step=1, blocked=cheap)) is None
    f = _finding(
        _two_ranks(per_step=4, blocked=cheap / 4, site=TOKENS_LINE, via="accelerate:Accelerator.gather")
    )
    assert f is not None and f.evidence["settings"] == ["include_num_input_tokens_seen=True"]
    assert f.confidence == 0.9 and f.severity == Severity.LOW
    assert "include_num_input_tokens_seen=True" in f.summary and TOKENS_LINE in f.summary
    assert "include_num_input_tokens_seen=False" in f.fix.text
    assert (
        f.fix.snippets["hf_trainer"] == "args = TrainingArguments(..., include_num_input_tokens_seen=False)"
    )


def test_relayed_settings_are_named_from_the_relaying_call() -> None:
    assert setting_of("/job/model.py:40 in Model.training_step", "lightning:LightningModule.log") == (
        "self.log(..., sync_dist=True)"
    )
    assert setting_of("/job/model.py:40 in Model.training_step", "pytorch_lightning:LightningModule.log") == (
        "self.log(..., sync_dist=True)"
    )
    assert setting_of("/job/train.py:9 in main", "torchmetrics:Metric.forward") == (
        "torchmetrics dist_sync_on_step=True"
    )
    assert setting_of("/job/train.py:9 in main", "accelerate:Accelerator.gather") is None
    assert (
        setting_of("/job/trainer.py:2792 in Trainer._track_num_input_tokens", None) is None
    )  # not transformers'
    p = _two_ranks(site="/job/model.py:40 in Model.training_step", via="lightning:LightningModule.log")
    for rank in p.ranks:
        rank.environment.framework = "lightning"
    f = _finding(p)
    assert f is not None and f.evidence["settings"] == ["self.log(..., sync_dist=True)"]
    assert "sync_dist=False" in f.fix.snippets["lightning"] and "sync_dist=True" in f.fix.text


def test_barriers_count_beside_the_metrics_of_their_line_but_not_alone() -> None:
    lightning = ("/job/model.py:40 in Model.training_step", "lightning:LightningModule.log")
    p = _two_ranks(per_step=4, site=lightning[0], via=lightning[1])
    for rank in p.ranks:  # Lightning's sync_dist: a barrier before each logged value's all-reduce
        barriers = [
            CollectiveRecord(c.step, "barrier", "0,1", 10_000 + i, 0, 2, c.issued_t, c.done_t, c.blocked_s,
                             site=c.site, via=c.via)
            for i, c in enumerate(rank.collectives) if c.site
        ]  # fmt: skip
        rank.collectives += barriers
    f = _finding(p)
    assert f is not None and f.evidence["sites"][0]["ops"] == ["all_reduce", "barrier"]
    assert f.evidence["calls_per_step"] == 8 and f.evidence["blocked_frac_of_step"] == pytest.approx(0.16)
    for rank in p.ranks:
        rank.collectives = [c for c in rank.collectives if c.op != "all_reduce" or c.source == "ddp"]
    assert _finding(p) is None  # a barrier every step is not a metric


def test_a_librarys_own_line_is_named_as_the_librarys() -> None:
    f = _finding(
        _two_ranks(site="trl/trainer/grpo_trainer.py:1200 in GRPOTrainer._generate_and_score_completions")
    )
    assert f is not None and f.summary.startswith("A library reduces a metric across ranks")
    assert "trl/trainer/grpo_trainer.py:1200" in f.fix.text


def test_on_the_device_clock_the_stream_span_counts() -> None:
    f = _finding(_two_ranks(clock="device", blocked=0.002, host_blocked=1e-5))  # the host only queued them
    assert f is not None and f.evidence["clock"] == "device"
    assert f.evidence["blocked_frac_of_step"] == pytest.approx(0.16)


def test_the_configured_setting_alone_fires_with_lower_confidence_and_no_estimate() -> None:
    setting = ["include_num_input_tokens_seen=True"]
    p = profile("cpu", steps(n=10), world_size=2, metric_sync_per_step=setting)
    f = _finding(p)
    assert f is not None and f.confidence == 0.5 and f.est_speedup is None
    assert f.evidence == {"configured": setting, "ranks": 2, "source": "config"}
    assert "include_num_input_tokens_seen=False" in f.fix.text
    assert _finding(profile("cpu", steps(n=10), world_size=1, metric_sync_per_step=setting)) is None
    live = _two_ranks(every=50, n=60)  # the live run saw no gather every step: it outranks the config
    for rank in live.ranks:
        rank.environment.metric_sync_per_step = setting
    assert _finding(live) is None


def test_sites_survive_the_document_round_trip() -> None:
    p = _two_ranks(site=TOKENS_LINE, via="accelerate:Accelerator.gather")
    back = RunProfile.from_dict(json.loads(json.dumps(p.to_dict())))
    assert back.ranks[0].collectives == p.ranks[0].collectives
    doc = json.loads(json.dumps(diagnose(p).to_dict()))
    (f,) = [f for f in read_run(doc).findings if f.cause == CauseId.METRIC_SYNC]
    assert f.evidence["sites"][0]["via"] == "accelerate:Accelerator.gather"


# -- the remedy ---------------------------------------------------------------------------------------------


def test_the_remedy_is_tried_only_through_the_trainers_setting() -> None:
    remedy = REGISTRY[RemedyId.SYNC_METRICS_LESS]

    def facts(framework: Framework) -> TrialFacts:
        return TrialFacts(on_gpu=False, hf_model=True, framework=framework, examples_are_text=False)

    assert remedy.tunable and remedy.preserves_computation
    assert remedy.cannot_try(facts(Framework.HF_TRAINER)) is None
    why = remedy.cannot_try(facts(Framework.PYTORCH))
    assert why is not None and "change the values" in why
    report = FixReport(None)
    remedy.rewrite_training_args(SimpleNamespace(include_num_input_tokens_seen="no"), FixRequest(), report)
    assert RemedyId.SYNC_METRICS_LESS in report.skipped and not report.applied
    advice = remedy.advice(Framework.PYTORCH, {"settings": ["torchmetrics Metric.compute() every step"]})
    assert "compute() only at logging steps" in advice.text


def test_the_trial_switches_the_trainers_token_count_off(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers import training_args

    from pitstop.remedies.arming import patch_training_arguments

    class Args(training_args.TrainingArguments):  # patch a subclass: the real class stays untouched
        pass

    class Module:
        TrainingArguments = Args

    report = FixReport(None)
    patch_training_arguments(Module, FixRequest(fixes=frozenset({"sync_metrics_less"})), report)  # type: ignore[arg-type]
    args = Args(output_dir=str(tmp_path), include_num_input_tokens_seen=True, use_cpu=True, report_to="none")
    assert args.include_num_input_tokens_seen == "no"
    assert (
        report.applied[RemedyId.SYNC_METRICS_LESS] == "TrainingArguments(include_num_input_tokens_seen='no')"
    )
    kept = REGISTRY[RemedyId.SYNC_METRICS_LESS].advice(
        Framework.HF_TRAINER, report.params[RemedyId.SYNC_METRICS_LESS]
    )
    assert "include_num_input_tokens_seen=False" in kept.text


# -- the collector's issuing line ---------------------------------------------------------------------------

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


def _recorded(job: Any) -> list[CollectiveRecord]:
    from pitstop.probe.collectors.collectives import CollectiveRecorder

    errors: list[BaseException] = []
    rec = CollectiveRecorder(0.0, lambda: 1, errors.append)
    rec.install()
    try:
        job()
    finally:
        rec.remove()
    assert not errors
    return rec.resolve(1)


def _code_in(path: str, source: str) -> dict[str, Any]:
    """Functions compiled as if they lay in ``path`` (a library's file): the walk reads only file names."""
    namespace: dict[str, Any] = {"dist": dist}
    exec(compile(source, path, "exec"), namespace)
    return namespace


def _line_of(text: str) -> int:
    return next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if text in line)


def test_the_jobs_own_call_is_its_line_and_the_result_unchanged(world1: Any) -> None:
    x = torch.tensor([3.0])

    def log_step() -> None:
        dist.all_reduce(x)  # the metric's reduce

    (row,) = _recorded(log_step)
    assert row.site == f"{__file__}:{_line_of('dist.all_reduce(x)  # the metric')} in {log_step.__qualname__}"
    assert row.via is None and row.source == "python" and torch.equal(x, torch.tensor([3.0]))


def test_nothing_inside_backward_has_a_line(world1: Any) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def job() -> None:
        w = torch.ones(2, requires_grad=True)
        w.register_hook(lambda g: (dist.all_reduce(g), g)[1])  # a collective inside backward
        (w * 2).sum().backward()
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
        model.register_comm_hook(None, allreduce_hook)  # a user's comm hook: python, inside backward
        model(torch.randn(3, 8)).sum().backward()

    reduces = [r for r in _recorded(job) if r.op == "all_reduce"]
    assert len(reduces) == 2 and all(r.source == "python" for r in reduces)
    assert [(r.site, r.via) for r in reduces] == [(None, None), (None, None)]


def test_a_relaying_library_is_looked_through_to_the_line_that_called_it(world1: Any, tmp_path: Path) -> None:
    lightning = _code_in(
        os.path.join(str(tmp_path), "site-packages", "lightning", "pytorch", "core", "module.py"),
        "class LightningModule:\n    def log(self, value):\n        dist.all_reduce(value)\n",
    )
    module = lightning["LightningModule"]()

    def training_step() -> None:
        module.log(torch.ones(1))  # self.log(..., sync_dist=True)

    (row,) = _recorded(training_step)
    assert row.site is not None and row.site.startswith(
        f"{__file__}:{_line_of('module.log(torch.ones(1))')} in "
    )
    assert (
        row.via == "lightning:LightningModule.log"
        and setting_of(row.site, row.via) == "self.log(..., sync_dist=True)"
    )


def test_torchmetrics_syncing_on_step_and_on_compute_is_named_at_the_jobs_line(world1: Any) -> None:
    """Real torchmetrics (which syncs through lightning_utilities and torch's Module.__call__, both passed)."""
    torchmetrics = pytest.importorskip("torchmetrics")
    on_step = torchmetrics.MeanMetric(dist_sync_on_step=True)
    local = torchmetrics.MeanMetric()

    def step() -> None:
        on_step(torch.tensor([1.0, 2.0]))  # forward syncs with dist_sync_on_step=True
        local.update(torch.tensor([1.0]))
        local.compute()  # compute() gathers the state every time

    rows = _recorded(step)
    assert {r.op for r in rows} == {"all_gather", "barrier"}
    lines = {r.via: r.site for r in rows}
    assert (
        lines["torchmetrics:Metric.forward"]
        == f"{__file__}:{_line_of('on_step(torch.tensor')} in {step.__qualname__}"
    )
    compute = "torchmetrics:Metric._wrap_compute.<locals>.wrapped_func"
    assert lines[compute] == f"{__file__}:{_line_of('local.compute()  #')} in {step.__qualname__}"
    assert setting_of(lines[compute], compute) == "torchmetrics Metric.compute() every step"
    assert setting_of(lines["torchmetrics:Metric.forward"], "torchmetrics:Metric.forward") == (
        "torchmetrics dist_sync_on_step=True"
    )


def test_torch_and_deepspeed_issuing_their_own_have_no_line(world1: Any, tmp_path: Path) -> None:
    fsdp = _code_in(
        os.path.join(os.path.dirname(torch.__file__), "distributed", "fsdp", "_runtime.py"),
        "def unshard(t):\n    dist.all_reduce(t)\n",
    )
    deepspeed = _code_in(
        os.path.join(str(tmp_path), "site-packages", "deepspeed", "comm", "torch.py"),
        "def all_reduce(t):\n    dist.all_reduce(t)\n",
    )
    rows = _recorded(lambda: (fsdp["unshard"](torch.ones(1)), deepspeed["all_reduce"](torch.ones(1))))
    assert [(r.site, r.via) for r in rows] == [(None, None), (None, None)]


def test_the_walk_stops_in_a_deep_stack(world1: Any) -> None:
    from pitstop.probe.collectors.collectives import MAX_FRAMES, issuing_site

    assert issuing_site(None, os.path.dirname(torch.__file__)) == (None, None)
    assert issuing_site(sys._getframe(), os.path.dirname(torch.__file__))[0] is not None
    assert MAX_FRAMES >= 32


def test_communication_bound_leaves_the_metric_collectives_to_metric_sync() -> None:
    """The same seconds are not two causes: 16 ms a step of the job's metric reduces is metric_sync's, and
    communication_bound (whose fixes are overlap, buckets, no_sync) counts only DDP's 10 ms wait as exposed."""
    findings = {f.cause: f for f in diagnose(_two_ranks(blocked=0.002)).findings}
    assert CauseId.METRIC_SYNC in findings
    comm = findings[CauseId.COMMUNICATION_BOUND]
    assert comm.evidence["exposed_frac_of_step"] == pytest.approx(0.10, abs=0.01)  # DDP's bucket only
    without_site = diagnose(_two_ranks(blocked=0.002, site=None)).findings  # nobody's metrics: all exposed
    comm = next(f for f in without_site if f.cause == CauseId.COMMUNICATION_BOUND)
    assert comm.evidence["exposed_frac_of_step"] == pytest.approx(0.26, abs=0.01)
