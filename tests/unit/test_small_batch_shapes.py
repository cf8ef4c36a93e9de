"""small_batch from the batch a trace's recorded shapes give: the estimate from how the step scales with
the batch, and "the model is too small for this GPU" where the batch is already large (issue 43, item 5)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import require_shared

from pitstop.core.findings import Finding
from pitstop.core.profile import RunProfile
from pitstop.core.vocabulary import CauseId, Source
from pitstop.diagnose import diagnose
from pitstop.trace import load_trace

RUNS = "gpu_runs/traces/hourany__data-bottleneck__num-workers-8-batch-size-{}.json.gz"


def _small_batch(path: Path) -> Finding | None:
    d = diagnose(RunProfile(source=Source.ANALYZE, ranks=[load_trace(path)]))
    return next((f for f in d.findings if f.cause == CauseId.SMALL_BATCH), None)


def _trace(tmp_path: Path, dims: list[Any] | None, op: str = "aten::linear", steps: int = 3) -> Path:
    """A hand-made Kineto trace: per step one layer call (with shapes when ``dims``), a 1 ms host gap,
    and 20 kernels of 4 µs plus one of 60 µs (one busy share: ~8% of a ~1.2 ms step)."""
    events: list[dict[str, Any]] = []
    corr = 0
    for s in range(steps):
        t0 = 10_000.0 + s * 2_000.0
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": f"ProfilerStep#{s + 1}",
                "ts": t0,
                "dur": 1_200.0,
                "pid": 1,
                "tid": 1,
                "args": {},
            }
        )
        args: dict[str, Any] = {"External id": s}
        if dims is not None:
            args["Input Dims"] = dims
            args["Input type"] = ["long" if op == "aten::embedding" else "float"] * len(dims)
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": op,
                "ts": t0 + 5,
                "dur": 50.0,
                "pid": 1,
                "tid": 1,
                "args": args,
            }
        )
        for i in range(21):
            corr += 1
            ts = t0 + 100 + i * 20
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "ts": ts,
                    "dur": 5.0,
                    "pid": 1,
                    "tid": 1,
                    "args": {"correlation": corr},
                }
            )
            dur = 60.0 if i == 20 else 4.0
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": f"k{i}",
                    "ts": ts + 10,
                    "dur": dur,
                    "pid": 0,
                    "tid": 7,
                    "args": {"correlation": corr, "device": 0, "stream": 7},
                }
            )
    path = tmp_path / "t.json.gz"
    doc = {"deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}], "traceEvents": events}
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def test_the_batch_is_read_from_the_real_traces_shapes() -> None:
    small = load_trace(require_shared() / RUNS.format(16)).trace
    large = load_trace(require_shared() / RUNS.format(2056)).trace
    assert small is not None and small.batch is not None and large is not None and large.batch is not None
    assert (small.batch.samples, large.batch.samples) == (16, 2056)
    assert small.batch.input_op == "aten::linear" and small.batch.weight_dims == [256, 2056]
    assert small.batch.forwards_per_step == 1 and small.batch.agreeing == 1.0
    # the MLP 2056→256→128→1 forward and backward: ~2.3 MFLOP per sample
    assert large.batch.gemm_gflop is not None and 4.0 < large.batch.gemm_gflop < 5.5
    assert large.batch.h2d_ms is not None and large.batch.h2d_ms > 1.0  # the 16.9 MB pageable copy


def test_batch_16_and_batch_2056_get_different_estimates_and_words() -> None:
    small = _small_batch(require_shared() / RUNS.format(16))
    large = _small_batch(require_shared() / RUNS.format(2056))
    assert small is not None and large is not None
    # batch 16: the step is nearly all once-per-step cost; a larger batch spreads it (no constant ×4 cap)
    assert small.evidence["batch_samples"] == 16 and "model_too_small" not in small.evidence
    assert small.est_speedup is not None and 4.0 < small.est_speedup < small.evidence["gain_bound"]
    assert small.evidence["suggested_batch"] > 16
    assert "batch 16 samples read from the trace's recorded shapes" in small.speedup_basis
    assert "at most" in small.speedup_basis and "capped at 4×" not in small.speedup_basis
    assert "Raise the micro-batch from 16 to" in small.fix.text
    # batch 2056: the model is too small for the GPU; the copy, not the batch, is the step's cost
    assert large.evidence["batch_samples"] == 2056 and large.evidence["model_too_small"] is True
    assert large.summary.startswith("The model is too small for this GPU")
    assert "copying the batch to the GPU" in large.summary
    assert large.est_speedup is not None and large.est_speedup < 2.0 and large.severity == "low"
    assert large.evidence["gain_bound"] < 3.0
    assert "Do not raise the batch" in large.fix.text and "pin" in large.fix.text


def test_a_hand_made_trace_with_shapes_gives_the_batch_and_a_bounded_estimate(tmp_path: Path) -> None:
    path = _trace(tmp_path, [[32, 512], [1024, 512], [1024]])
    t = load_trace(path).trace
    assert t is not None and t.batch is not None
    assert t.batch.samples == 32 and t.batch.kernels_per_step == 21
    # kernel floors: 20 × 4 µs + 5 µs of the long one; above them: 55 µs
    assert t.batch.kernel_floor_ms == pytest.approx(0.085) and t.batch.kernel_ms == pytest.approx(0.14)
    f = _small_batch(path)
    assert f is not None and f.evidence["batch_samples"] == 32
    assert f.evidence["kernels_above_floor_ms"] == pytest.approx(0.055)
    bound = f.evidence["gain_bound"]
    assert f.est_speedup is not None and 1.0 < f.est_speedup <= bound
    assert bound == pytest.approx(f.evidence["step_ms"] / f.evidence["grows_with_batch_ms"], rel=0.01)


def test_token_ids_give_samples_and_tokens(tmp_path: Path) -> None:
    t = load_trace(_trace(tmp_path, [[50_000, 768], [8, 512], [], [], []], op="aten::embedding")).trace
    assert t is not None and t.batch is not None
    assert (t.batch.samples, t.batch.tokens, t.batch.input_op) == (8, 4096, "aten::embedding")


def test_a_trace_without_shapes_keeps_the_old_basis_and_says_batch_unknown(tmp_path: Path) -> None:
    path = _trace(tmp_path, None)
    t = load_trace(path).trace
    assert t is not None and t.batch is None
    f = _small_batch(path)
    assert f is not None and "batch_samples" not in f.evidence
    assert "batch unknown" in f.speedup_basis and f.est_speedup == 4.0
