"""`pitstop analyze` on a folder of rank traces: parallel reading, clock alignment, arrival skew, the rank the
others wait for and why, unreadable traces skipped, NCCL / RCCL kernel names of every version.

The traces come from tests/kineto_ranks.py: a simulated data-parallel job whose clock offsets and straggler
are known exactly, so the assertions are about which rank and which cause, never about speed.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from tests import kineto_ranks as kr
from tests.conftest import run_pitstop

from pitstop.artifacts import IngestError
from pitstop.diagnose import diagnose
from pitstop.ingest.load import Inputs, load_run
from pitstop.trace.events import COLLECTIVE_KINDS, COMMUNICATION, _kernel_class, collective_kind
from pitstop.trace.fleet import default_jobs, read_traces
from pitstop.trace.summary import rank_from_name

OFFSETS = [0.0, 730.5, -410.25, 1200.0, 55.0, -999.5, 310.0, 42.0]


def _findings(folder: Path, **kw: object) -> dict[str, object]:
    return {f.cause: f for f in diagnose(load_run(Inputs(paths=[folder], **kw))).findings}  # type: ignore[arg-type]


def test_clock_offsets_between_ranks_are_corrected(tmp_path: Path) -> None:
    folder = kr.write_folder(tmp_path / "t", kr.job(len(OFFSETS), offsets=OFFSETS))
    result = read_traces(sorted(folder.iterdir()), jobs=1)
    assert [r.rank for r in result.ranks] == list(range(len(OFFSETS)))
    for rank in result.ranks:
        t = rank.trace
        assert t is not None and t.collectives == 6
        assert t.clock_offset_us == pytest.approx(OFFSETS[rank.rank], abs=0.01)
        # nobody is late once the clocks agree, although raw timestamps differ by up to 2.2 ms
        assert t.arrival_skew_ms == pytest.approx(0.0, abs=1e-6)
        assert t.collective_wait_ms == pytest.approx(0.0, abs=1e-6)
    assert "straggler" not in _findings(folder, jobs=1)


@pytest.mark.slow
def test_planted_straggler_found_through_the_process_pool(tmp_path: Path) -> None:
    docs = kr.job(16, offsets=(OFFSETS * 2)[:16], straggler=11, extra_host_us=3000)
    folder = kr.write_folder(tmp_path / "t", docs)
    found = _findings(folder, jobs=2)
    f = found["straggler"]
    ev = f.evidence  # type: ignore[attr-defined]
    assert ev["slow_rank"] == 11
    assert ev["arrival_late_ms"] == pytest.approx(3.0, abs=0.01)
    assert ev["arrival_skew_ms"] == pytest.approx(3.0, abs=0.01)
    assert ev["last_arrival_frac"] == 1.0
    assert 0.15 < ev["waiting_frac_others"] < 0.3  # 3 ms of a ~14.5 ms step
    assert "for the host" in ev["reason"] and "DataLoader" in ev["reason"]
    # the fast ranks' all-reduce kernels are long because they wait: that is the straggler's cost, not the link's
    comm = found["communication_bound"].evidence  # type: ignore[attr-defined]
    assert comm["exposed_comm_frac"] == pytest.approx(2.0 / 14.5, abs=0.01)
    assert comm["bus_bandwidth_gbps"] == pytest.approx(
        2 * 15 / 16 * 100e6 / 2000 / 1e3, rel=0.01
    )  # NCCL-tests


@pytest.mark.slow
def test_planted_straggler_found_through_a_dask_local_cluster(tmp_path: Path) -> None:
    pytest.importorskip("dask.distributed")
    folder = kr.write_folder(tmp_path / "t", kr.job(16, straggler=5, extra_kernel_us=4000))
    found = _findings(folder, jobs=2, dask="local")
    ev = found["straggler"].evidence  # type: ignore[attr-defined]
    assert ev["slow_rank"] == 5 and ev["ranks"] == 16
    assert "kernels take 4.0 ms more" in ev["reason"]  # a slow GPU, not its input pipeline


def test_slow_gpu_and_slow_host_are_told_apart(tmp_path: Path) -> None:
    gpu = kr.write_folder(tmp_path / "gpu", kr.job(4, straggler=2, extra_kernel_us=3000))
    reason = _findings(gpu, jobs=1)["straggler"].evidence["reason"]  # type: ignore[attr-defined]
    assert "kernels take 3.0 ms more" in reason
    two = kr.write_folder(tmp_path / "two", kr.job(2, straggler=1, extra_host_us=3000))
    f = _findings(two, jobs=1)["straggler"]
    assert f.evidence["slow_rank"] == 1  # type: ignore[attr-defined]
    assert "the other rank" in f.summary and "median" not in f.summary  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_truncated_trace_among_good_ones_is_reported_and_skipped(tmp_path: Path) -> None:
    folder = kr.write_folder(tmp_path / "t", kr.job(4, steps=40, straggler=3, extra_host_us=3000))
    broken = folder / "rank-2.pt.trace.json.gz"
    broken.write_bytes(broken.read_bytes()[: broken.stat().st_size // 2])  # its head still reads as a trace
    profile = load_run(Inputs(paths=[folder], jobs=2))
    assert sorted(r.rank for r in profile.ranks) == [0, 1, 3]
    skipped = [n for n in profile.notes if n.startswith("skipped rank-2")]
    assert len(skipped) == 1 and "truncated" in skipped[0]
    assert {f.cause: f for f in diagnose(profile).findings}["straggler"].evidence["slow_rank"] == 3


def test_one_unreadable_trace_alone_is_an_error(tmp_path: Path) -> None:
    path = kr.write(kr.job(1)[0], tmp_path / "rank-0.json.gz")
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(IngestError, match="truncated"):
        read_traces([path], jobs=1)


KERNELS = [
    ("ncclAllReduceRingLLKernel_sum_f32(ncclColl)", "allreduce"),  # NCCL 2.4-2.7
    ("ncclBroadcastRingLLKernel_copy_i8(ncclColl)", "broadcast"),
    ("ncclSendRecvKernel_copy_i8(ncclWorkElem)", "sendrecv"),
    (
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
        "allreduce",
    ),  # 2.8-2.18
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "allgather"),
    (
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "reducescatter",
    ),  # 2.19+
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "allgather"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "sendrecv"),
    ("void ncclKernel_AllReduce_RING_LL_Sum_half(ncclDevComm*, unsigned long, ncclWork*)", "allreduce"),
    ("mscclKernel_Sum_bf16_LL(mscclAlgo*, mscclWork*, unsigned long)", "other"),  # RCCL's MSCCL
    ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", "other"),  # RCCL: the kind is in the args
]


@pytest.mark.parametrize(("name", "kind"), KERNELS)
def test_nccl_and_rccl_kernel_names_of_every_version(name: str, kind: str) -> None:
    assert _kernel_class(name) == COMMUNICATION
    assert COLLECTIVE_KINDS[collective_kind(name)] == kind
    for compute in ("ampere_bf16_s16816gemm_bf16_128x128", "void at::native::vectorized_elementwise_kernel"):
        assert _kernel_class(compute) != COMMUNICATION


def test_ranks_on_different_nccl_versions_still_match(tmp_path: Path) -> None:
    names = {0: kr.OLD_NCCL, 1: kr.NEW_NCCL, 2: kr.RCCL_GENERIC}  # the generic one says "allreduce" in args
    folder = kr.write_folder(
        tmp_path / "t", kr.job(3, offsets=OFFSETS[:3], straggler=0, extra_host_us=2000, nccl_names=names)
    )
    result = read_traces(sorted(folder.iterdir()), jobs=1)
    assert [r.trace.collectives for r in result.ranks if r.trace] == [6, 6, 6]
    assert result.ranks[0].trace is not None and result.ranks[0].trace.last_arrival_frac == 1.0


def test_rank_numbers_from_names_and_from_the_trace(tmp_path: Path) -> None:
    assert rank_from_name(Path("rank-3.json")) == 3
    assert rank_from_name(Path("worker12.pt.trace.json.gz")) == 12
    assert rank_from_name(Path("node_1_rank_7.1700.pt.trace.json")) == 7
    assert rank_from_name(Path("trace.json")) is None
    docs = kr.job(2)
    for doc in docs:
        del doc["distributedInfo"]
    kr.write(docs[0], tmp_path / "worker1.json")
    kr.write(docs[1], tmp_path / "worker0.json")
    assert [r.rank for r in read_traces(sorted(tmp_path.iterdir()), jobs=1).ranks] == [0, 1]
    assert 1 <= default_jobs(sorted(tmp_path.iterdir())) <= 2


@pytest.mark.slow
def test_the_summary_stays_short_at_many_ranks(tmp_path: Path) -> None:
    docs = kr.job(64, steps=3, kernels=4, straggler=40, extra_host_us=2500)
    folder = kr.write_folder(tmp_path / "t", docs)
    profile = load_run(Inputs(paths=[folder], jobs=2))
    assert len(profile.ranks) == 64
    assert len(profile.notes) <= 3 and all(len(n) < 400 for n in profile.notes)
    assert any(n.startswith("64 ranks: step") for n in profile.notes)
    assert any("the latest rank is 40" in n for n in profile.notes)


@pytest.mark.slow
def test_cli_jobs_progress_and_json(tmp_path: Path) -> None:
    folder = kr.write_folder(tmp_path / "t", kr.job(4, straggler=1, extra_host_us=3000))
    out = tmp_path / "run.json"
    proc = run_pitstop("analyze", str(folder), "--jobs", "2", "--json", str(out), "--no-history")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    straggler = next(f for f in doc["findings"] if f["cause"] == "straggler")
    assert straggler["evidence"]["slow_rank"] == 1
    per_rank = [r["trace"]["arrival_late_ms"] for r in doc["profile"]["ranks"]]
    assert max(per_rank) == pytest.approx(3.0, abs=0.01) and per_rank.index(max(per_rank)) == 1
    bad = run_pitstop("analyze", str(folder), "--dask", "tcp://127.0.0.1:9", "--no-history")
    assert bad.returncode == 2
    assert "cannot reach the scheduler" in bad.stderr or "needs dask.distributed" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_gzip_layout_is_not_needed(tmp_path: Path) -> None:
    """Plain JSON and gzip traces, compact or one event per line, read the same."""
    doc = kr.job(1)[0]
    a = kr.write(doc, tmp_path / "a.json")
    b = tmp_path / "b.json.gz"
    b.write_bytes(gzip.compress(json.dumps(doc, separators=(",", ":")).encode()))
    ra, rb = (read_traces([p], jobs=1).ranks[0].trace for p in (a, b))
    assert ra is not None and rb is not None
    assert (ra.breakdown_ms, ra.nccl_ms) == (rb.breakdown_ms, rb.nccl_ms)
    steps_a, steps_b = (read_traces([p], jobs=1).ranks[0].steps for p in (a, b))
    assert steps_a == steps_b


def test_default_jobs_follow_cores_and_free_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    paths = [kr.write(doc, tmp_path / f"rank-{i}.json") for i, doc in enumerate(kr.job(4, steps=2))]
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(64)), raising=False)

    class Memory:
        available = 64 << 30

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Memory)
    assert default_jobs(paths) == 4  # no more workers than traces
    Memory.available = 450 << 20  # room for two readers of this size (160 MiB each, 80% of it), not four
    assert default_jobs(paths) == 2
    Memory.available = 1 << 20
    assert default_jobs(paths) == 1
