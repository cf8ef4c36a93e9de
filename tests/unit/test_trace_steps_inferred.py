"""Issue 43, items 1, 2, 3 and 6: a trace without ProfilerStep#N is still analysed (steps from other markers,
else the whole trace as one window), the runtime calls the host sits in are evidence (allocator_thrash,
host_sync), idle-based estimates are bounded by the GPU's own busy time, and an inference trace says so."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from tests.conftest import require_shared
from tests.factories import profile, steps
from tests.trace_builder import TraceBuilder, hipfree_trace

from pitstop.core.profile import RunProfile, TraceStats
from pitstop.core.vocabulary import RuntimeApi, Workload
from pitstop.diagnose import diagnose
from pitstop.trace import load_trace, profile_of
from pitstop.trace.events import read_columns

FIXTURE = Path(__file__).parents[1] / "fixtures" / "traces" / "hipfree_no_steps.json"


def _findings(rank_trace: Path) -> dict[str, object]:
    rank = load_trace(rank_trace)
    d = diagnose(RunProfile(source="analyze", ranks=[rank]))
    return {f.cause.value: f for f in d.findings}


def _without(src: Path, tmp_path: Path, *prefixes: str) -> Path:
    """A real trace with the events whose names start with ``prefixes`` left out (written to tmp_path)."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith(prefixes)]
    out = tmp_path / "stripped.json"
    out.write_text(json.dumps(doc))
    return out


def test_the_fixture_is_the_builders_output() -> None:
    built = json.loads(json.dumps({"traceEvents": hipfree_trace().events}))["traceEvents"]
    assert json.loads(FIXTURE.read_text())["traceEvents"] == built


def test_no_markers_at_all_is_one_window_and_the_allocator_is_named() -> None:
    """The issue's MI300X trace: no ProfilerStep, 98.6% of the host's time in hipFree, GPU busy 10.6%."""
    rank = load_trace(FIXTURE)
    t = rank.trace
    assert t is not None and t.steps_from is not None
    assert t.steps_from.startswith("no step markers: the whole 100.0 ms trace read as one window")
    assert len(rank.steps) == 1 and t.breakdown_ms is not None  # the breakdown ran
    assert t.gpu_busy_frac == pytest.approx(0.106, abs=0.005)
    top = t.runtime_calls[0]
    assert (top.name, top.kind) == ("hipFree", RuntimeApi.ALLOC)
    assert t.workload == Workload.INFERENCE  # forward only: no backward node, no optimizer
    f = _findings(FIXTURE)["allocator_thrash"]
    assert "hipFree" in f.evidence["calls"] and f.evidence["top_call"] == "hipFree"
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING" in f.summary
    # removing the hipFree time leaves the GPU's own 10.6%: at most 1/0.106, not the 71x the host share says
    assert f.est_speedup == pytest.approx(1 / t.gpu_busy_frac, rel=1e-3)
    assert "at most ×9.4" in f.speedup_basis


def _sync_trace(tmp_path: Path, marker: str | None) -> Path:
    """Steps of 10 ms on an H100: 9 ms of kernels, then the host waits in cudaStreamSynchronize for 4 ms of
    which the GPU idles 1 ms; each step marked by ``marker`` (an annotation name) or by nothing."""
    t = TraceBuilder()
    for i in range(6):
        t0 = i * 10_000.0
        if marker == "Optimizer.step":
            t.cpu("Optimizer.step#AdamW.step", t0 + 9_900, 90.0, cat="user_annotation")
        elif marker:
            t.cpu(f"{marker}_{i}", t0, 9_990.0, cat="user_annotation")
        t.cpu("aten::mm", t0 + 10, 50.0)
        t.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", t0 + 100, 9_000.0, t0 + 20)
        t.runtime("cudaStreamSynchronize", t0 + 6_000, 4_000.0)
    return t.write(tmp_path / "sync.json")


@pytest.mark.parametrize(
    ("marker", "how"),
    [
        ("Optimizer.step", "Optimizer.step spans"),
        ("train_step", "repeated annotation 'train_step_N'"),
        (None, "the whole"),
    ],
)
def test_steps_found_by_the_markers_there_are(tmp_path: Path, marker: str | None, how: str) -> None:
    rank = load_trace(_sync_trace(tmp_path, marker))
    assert rank.trace is not None and how in (rank.trace.steps_from or "")
    assert rank.steps and rank.trace.breakdown_ms is not None


def test_host_sync_counts_only_the_wait_while_the_gpu_idles(tmp_path: Path) -> None:
    """The host blocks 40% of each step, but the GPU computes through 3/4 of that: 10% is lost, and removing
    every idle gap can give at most 1/busy (90%: x1.11)."""
    path = _sync_trace(tmp_path, "Optimizer.step")
    t = load_trace(path).trace
    assert t is not None and t.gpu_busy_frac == pytest.approx(0.9, abs=0.02)
    sync = next(c for c in t.runtime_calls if c.name == "cudaStreamSynchronize")
    assert sync.kind == RuntimeApi.SYNC and sync.gpu_busy_frac == pytest.approx(0.75, abs=0.03)
    f = _findings(path)["host_sync"]
    assert f.evidence["blocking_calls"]["cudaStreamSynchronize"]["gpu_busy"] == sync.gpu_busy_frac
    assert f.est_speedup <= 1 / t.gpu_busy_frac + 1e-9
    assert "the GPU was busy 90% of the step: at most ×1.1" in f.speedup_basis


def test_host_sync_bound_by_the_gpus_busy_share_without_runtime_detail() -> None:
    """The issue's H100 case: the host blocked 46% of each step (x1.86 by the host share alone) while the GPU
    was busy 90.3%: removing every idle gap gives at most x1.11."""
    run = profile("cuda", steps(syncs=4, sync_s=0.046, wall=0.1), util=None)
    run.ranks[0].trace = TraceStats(gpu_util=0.9, gpu_busy_frac=0.903)
    f = {x.cause.value: x for x in diagnose(run).findings}["host_sync"]
    assert f.est_speedup == pytest.approx(1 / 0.903, rel=1e-3)
    assert "the GPU was busy 90% of the step: at most ×1.11" in f.speedup_basis


# real traces (../shared/data): their markers taken out one kind after another


def test_real_trace_without_profiler_steps_keeps_its_steps(tmp_path: Path) -> None:
    src = require_shared("traces") / "hta__trace_diff__control__control.json.gz"
    real = profile_of(read_columns(src))[1]
    view = profile_of(read_columns(_without(src, tmp_path, "ProfilerStep")))[1]
    assert "Optimizer.step" in view.steps_from
    assert len(view.steps) == len(real.steps) == 6
    assert view.mean_step_us == pytest.approx(real.mean_step_us, rel=0.02)
    view = profile_of(read_columns(_without(src, tmp_path, "ProfilerStep", "Optimizer.")))[1]
    assert "repeated annotation '## backward ##'" in view.steps_from  # the job's own ## markers
    assert view.mean_step_us == pytest.approx(real.mean_step_us, rel=0.05)


def test_real_trace_with_only_its_backward_passes(tmp_path: Path) -> None:
    src = require_shared("gpu_runs/traces") / "hourany__data-bottleneck__num-workers-0-batch-size-16.json.gz"
    path = _without(src, tmp_path, "ProfilerStep", "Optimizer.")
    rank = load_trace(path)
    assert rank.trace is not None and "3 backward passes" in (rank.trace.steps_from or "")
    assert len(rank.steps) == 3 and rank.trace.workload == Workload.TRAINING


def test_real_trace_with_no_markers_is_one_window_and_still_diagnosed(tmp_path: Path) -> None:
    """The 16-rank A100 trace with every step marker and backward node taken out: one window of 1.2 s, and the
    host's wait in blocking device-to-host copies is still found."""
    src = require_shared("traces") / "hta__negative_queue_length_values_check__rank0.json.gz"
    path = _without(
        src, tmp_path, "ProfilerStep", "Optimizer.", "##", "autograd::engine", "DistributedDataParallel"
    )
    rank = load_trace(path)
    assert rank.trace is not None
    assert (rank.trace.steps_from or "").startswith(
        "no step markers: the whole 1.2 s trace read as one window"
    )
    assert len(rank.steps) == 1 and rank.trace.breakdown_ms is not None
    f = _findings(path)["host_sync"]
    assert "cudaMemcpyAsync (blocking)" in f.evidence["blocking_calls"]


def test_real_blocking_copies_are_host_syncs() -> None:
    """On the same trace with its steps: cudaMemcpyAsync calls that return only after their device-to-host copy
    ended (pageable memory) are where the host waits, with the GPU mostly idle meanwhile."""
    src = require_shared("traces") / "hta__negative_queue_length_values_check__rank0.json.gz"
    t = load_trace(src).trace
    assert t is not None and t.steps_from == "ProfilerStep#N spans"
    copy = next(c for c in t.runtime_calls if c.name == "cudaMemcpyAsync (blocking)")
    assert (
        copy.kind == RuntimeApi.BLOCKING_COPY and copy.gpu_busy_frac is not None and copy.gpu_busy_frac < 0.5
    )
    f = _findings(src)["host_sync"]
    assert f.est_speedup <= 1 / (t.gpu_busy_frac or 1) + 1e-9
    assert "at most ×" in f.speedup_basis


def test_real_mi250_runtime_calls_are_evidence() -> None:
    """The MI250 toy: one step whose host time is mostly hipLaunchKernel, with the GPU idle meanwhile."""
    t = load_trace(
        require_shared("traces") / "hta__amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    ).trace
    assert t is not None and t.workload == Workload.TRAINING
    top = t.runtime_calls[0]
    assert (top.name, top.kind) == ("hipLaunchKernel", RuntimeApi.LAUNCH) and top.gpu_busy_frac == 0.0
    assert any(
        c.name == "hipMemcpyWithStream" and c.kind == RuntimeApi.BLOCKING_COPY for c in t.runtime_calls
    )


def test_idle_time_the_host_spends_in_hipfree_is_not_called_a_small_batch() -> None:
    """The GPU idles because the host sits in hipFree with the GPU idle (98.6% of the step): allocator_thrash
    names it; small_batch does not claim the same idle time."""
    from pitstop.diagnose.causes.small_batch import BLOCKED_EXPLAINS, host_blocked_while_idle

    rank = load_trace(FIXTURE)
    assert rank.trace is not None and host_blocked_while_idle([rank.trace]) > BLOCKED_EXPLAINS
    found = _findings(FIXTURE)
    assert "allocator_thrash" in found and "small_batch" not in found


def test_a_blocking_copy_while_the_gpu_works_leaves_small_batch_its_say() -> None:
    """negative_queue's rank 0 waits in a device-to-host copy while the GPU is busy 40% of that time: the
    idle is not all the copy's, so small_batch still speaks beside host_sync."""
    path = require_shared("traces/hta__negative_queue_length_values_check__rank0.json.gz")
    found = _findings(path)
    assert {"small_batch", "host_sync"} <= set(found)
