"""The collective recorder in one process (a 1-rank gloo group), and the multi-node gather with a fake store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from pitstop.core.profile import RankProfile, StepRecord  # noqa: E402
from pitstop.probe import gather  # noqa: E402
from pitstop.probe.collectors.collectives import CollectiveRecorder  # noqa: E402


@pytest.fixture(scope="module")
def world1(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One 1-rank gloo group for the whole module. A group destroyed and the next created at once, test
    after test, once aborted the whole pytest process on a busy machine (SIGABRT from a gloo thread while
    the next group was being made); no test here needs a fresh group."""
    store = tmp_path_factory.mktemp("world1") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class FakeDeviceMarks:
    """Stands in for CUDA events: each mark is a recorded device time, read at the end."""

    clock = "device"

    def __init__(self) -> None:
        self.t = 0.0

    def mark(self) -> float:
        self.t += 0.5
        return self.t

    def seconds(self, handle: Any) -> float:
        return float(handle)


def test_collectives_are_recorded_and_results_unchanged(world1: Any) -> None:
    errors: list[BaseException] = []
    step = [1]
    rec = CollectiveRecorder(0.0, lambda: step[0], errors.append)
    originals = (dist.all_reduce, dist.all_gather_into_tensor, dist.barrier)
    rec.install()
    try:
        assert dist.all_reduce is not originals[0]
        x = torch.arange(6, dtype=torch.float32)
        dist.all_reduce(x)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        out = torch.empty(6)
        dist.all_gather_into_tensor(out, x)
        dist.barrier()
        record = StepRecord(index=1, wall_s=0.1)
        rec.close_step(record)
    finally:
        rec.remove()
    assert (dist.all_reduce, dist.all_gather_into_tensor, dist.barrier) == originals
    assert torch.equal(x, torch.arange(6, dtype=torch.float32)) and torch.equal(out, x)
    assert not errors
    rows = rec.resolve(1)
    assert [(r.op, r.seq, r.bytes, r.group) for r in rows] == [
        ("all_reduce", 0, 24, "0"),
        ("all_reduce", 1, 24, "0"),
        ("all_gather", 2, 24, "0"),
        ("barrier", 3, 0, "0"),
    ]
    assert rows[0].blocked_s is not None and rows[1].blocked_s is None and rows[1].done_t is not None
    assert record.collectives == 4 and record.collective_bytes == 72


def test_ddp_buckets_go_through_the_timed_hook_with_the_same_gradients(world1: Any) -> None:
    def grads(observed: bool) -> list[Any]:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
        model(torch.randn(3, 8)).pow(2).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = grads(False)
    rec = CollectiveRecorder(0.0, lambda: 1, lambda exc: None)
    rec.install()
    try:
        observed = grads(True)
    finally:
        rec.remove()
    assert all(torch.equal(a, b) for a, b in zip(plain, observed, strict=True))
    (row,) = rec.resolve(1)
    assert row.source == "ddp" and row.op == "all_reduce" and row.bytes == (8 * 4 + 4) * 4


def test_ddp_built_with_its_module_named_is_handed_on(world1: Any) -> None:
    """Lightning builds ``DistributedDataParallel(module=model, ...)``: the wrapper must pass the name on (it
    once took ``module`` as its own first parameter and raised TypeError into the job)."""
    rec = CollectiveRecorder(0.0, lambda: 1, lambda exc: None)
    rec.install()
    try:
        model = torch.nn.parallel.DistributedDataParallel(module=torch.nn.Linear(8, 4), device_ids=None)
        model(torch.randn(3, 8)).sum().backward()
    finally:
        rec.remove()
    assert isinstance(model.module, torch.nn.Linear)
    assert [r.source for r in rec.resolve(1)] == ["ddp"]


def test_a_users_own_comm_hook_is_left_alone(world1: Any) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    rec = CollectiveRecorder(0.0, lambda: 1, lambda exc: None)
    rec.install()
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
        model.register_comm_hook(None, allreduce_hook)
        model(torch.randn(3, 8)).sum().backward()
    finally:
        rec.remove()
    assert [h for h, _ in model._comm_hooks] == [allreduce_hook]
    (row,) = rec.resolve(1)
    assert row.source == "python"  # theirs, seen through the all_reduce wrapper


def test_device_marks_resolve_to_device_seconds(world1: Any) -> None:
    rec = CollectiveRecorder(0.0, lambda: 3, lambda exc: None)
    rec.marks = FakeDeviceMarks()
    rec.install()
    try:
        dist.all_reduce(torch.ones(4))
    finally:
        rec.remove()
    (row,) = rec.resolve(3)
    assert row.clock == "device" and (row.issued_t, row.done_t) == (0.5, 1.0)
    assert row.blocked_s is not None  # host-blocked time is still the host's
    assert rec.resolve(4) == []


class FakeStore:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        return self.data[key]


def test_rank0_gathers_other_nodes_and_names_the_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FakeStore()
    store.set(
        "pitstop/rank/1",
        json.dumps({"node": "b#1", "profile": {"rank": 1, "steps": [{"index": 1, "wall_s": 0.1}]}}),
    )
    monkeypatch.setattr(gather, "_store", store)
    monkeypatch.setattr(gather, "POLL_S", 0.01)
    for k, v in {
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "0",
        gather.ENV_TIMEOUT: "0.2",
    }.items():
        monkeypatch.setenv(k, v)
    gather.exchange(RankProfile(rank=0), tmp_path)
    summary = gather.read_summary(tmp_path)
    assert summary is not None and summary["missing_ranks"] == [2, 3]
    assert summary["missing_nodes"] == ["node 2", "node 3"]
    assert (tmp_path / "rank-remote-00001.jsonl").exists()
    assert store.check(["pitstop/gathered"])


def test_a_single_node_job_gathers_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    gather.exchange(RankProfile(rank=0), tmp_path)
    assert gather.read_summary(tmp_path) is None


RUNNER = gather.ENV_RUNNER_PID


@pytest.mark.parametrize(
    ("env", "parent", "spans"),
    [
        ({"WORLD_SIZE": "4", RUNNER: "77"}, 77, True),  # srun: pitstop started this one rank itself
        ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4", RUNNER: "77"}, 77, True),  # exported by a batch script
        (
            {"SLURM_NTASKS": "2", RUNNER: "77"},
            77,
            True,
        ),  # the script reads SLURM_PROCID / SLURM_NTASKS itself
        ({"SLURM_NTASKS": "1", RUNNER: "77"}, 77, False),
        ({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", RUNNER: "77"}, 78, True),  # torchrun --nnodes 2
        ({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", RUNNER: "77"}, 78, False),  # torchrun on one node
        ({"WORLD_SIZE": "2", RUNNER: "77"}, 78, False),  # a launcher pitstop cannot see into
        ({RUNNER: "77"}, 77, False),  # a plain script
    ],
)
def test_spans_nodes_when_another_pitstop_runs_some_of_the_ranks(
    env: dict[str, str], parent: int, spans: bool
) -> None:
    assert gather.spans_nodes(env, parent) is spans


def _gather_as_rank0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, payloads: dict[int, dict[str, Any]]
) -> None:
    store = FakeStore()
    for rank, payload in payloads.items():
        store.set(f"pitstop/rank/{rank}", json.dumps(payload))
    monkeypatch.setattr(gather, "_store", store)
    monkeypatch.setattr(gather, "POLL_S", 0.01)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("WORLD_SIZE", str(len(payloads) + 1))
    monkeypatch.setenv(gather.ENV_TIMEOUT, "0.2")
    monkeypatch.setattr(gather, "spans_nodes", lambda: True)
    gather.exchange(RankProfile(rank=0), tmp_path)


def test_srun_ranks_on_rank_0s_node_are_gathered_by_their_pitstop_not_their_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = gather.node_of()
    profile = {"rank": 1, "steps": [{"index": 1, "wall_s": 0.1}]}
    other = {"node": node, "runner": gather.runner_of(tmp_path / "elsewhere"), "profile": profile}
    own = {"node": node, "runner": gather.runner_of(tmp_path), "profile": {**profile, "rank": 2}}
    _gather_as_rank0(tmp_path, monkeypatch, {1: other, 2: own})
    assert (tmp_path / "rank-remote-00001.jsonl").exists()  # another pitstop on this node: written for it
    assert not (tmp_path / "rank-remote-00002.jsonl").exists()  # rank 0's own pitstop: it wrote its own file
    summary = gather.read_summary(tmp_path)
    assert summary is not None and summary["role"] == "gathered" and summary["missing_ranks"] == []


def test_rank_0s_summary_wins_over_its_node_mates_sent_one(tmp_path: Path) -> None:
    (tmp_path / gather.SENT).write_text(json.dumps({"role": "sent", "rank0_node": "a#0"}))
    assert gather.read_summary(tmp_path) == {"role": "sent", "rank0_node": "a#0"}
    (tmp_path / gather.SUMMARY).write_text(json.dumps({"role": "gathered", "missing_ranks": [3]}))
    assert gather.read_summary(tmp_path) == {"role": "gathered", "missing_ranks": [3]}


def test_ddp_with_gradient_as_bucket_view_is_left_untimed(world1: Any) -> None:
    rec = CollectiveRecorder(0.0, lambda: 1, lambda exc: None)
    rec.install()
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4), gradient_as_bucket_view=True)
        model(torch.randn(3, 8)).sum().backward()
    finally:
        rec.remove()
    assert model._comm_hooks == [] and rec.resolve(1) == []
