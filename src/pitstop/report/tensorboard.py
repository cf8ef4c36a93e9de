"""Export a saved pitstop document as TensorBoard scalars, so pitstop's numbers sit beside the user's runs.

Where it writes: one new run folder per export, ``<out_dir>/pitstop-<kind>-<UTC timestamp>`` (kind is the
document's source: doctor, analyze, tune…), so that pointing TensorBoard at the folder that holds the
user's own runs shows pitstop's export as one more run and a second export never mixes with the first.
Rank 0 writes into that folder; rank r > 0 into ``<run>/rank<r>``, a run of its own, so the same tag
overlays all ranks in one chart.

Steps: a measured step's global step is ``warmup_steps + position`` (1-based), the optimizer steps
counted from the start of the process: the probe's own ``StepRecord.index`` and the Hugging Face
Trainer's ``global_step``, so the scalars line up with the user's ``train/loss``. Wall times are the
run's start (``started_at``, else the export's time) plus the measured step times, so TensorBoard's
"relative" axis reads measured seconds.

GPU samples (``GpuSample.t``) share the probe's clock with ``window_start_t``, and measured steps follow
one another without gaps (each step's wall time runs from the end of the previous one), so the step in
progress at a sample's time is found from the cumulative step times. Samples inside a step are averaged
into that step; samples outside the measured window are left out, as the report leaves them out. Where
no window start is known (nvidia-smi logs, traces) they are written by sample index under
``pitstop/by_sample/…`` instead, never on the step axis.

The writer is TensorBoard's own event-file writer (what ``torch.utils.tensorboard.SummaryWriter`` wraps),
used directly so the export needs neither torch nor TensorFlow; tensorboardX is the fallback. Scalars are
written as ``simple_value``, as the Trainer's TensorBoard callback writes them.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pitstop import schemas
from pitstop.core.profile import RunProfile, StepRecord
from pitstop.diagnose import Diagnosis
from pitstop.diagnose.document import read_run
from pitstop.diagnose.gpu_windows import GpuWindow
from pitstop.diagnose.series import StepSeries
from pitstop.report.errors import ReportError

MISSING_WRITER = "--tensorboard needs the tensorboard package: pip install 'pitstop[tensorboard]'"
GIB = 2**30
SUMMARY_METRICS = ("real_tokens_per_s", "tokens_per_s", "mfu", "gpu_util", "scaling_efficiency")

# (GpuSample field, tag, factor to the tag's unit)
GPU_FIELDS: tuple[tuple[str, str, float], ...] = (
    ("util", "gpu_util", 1.0),  # %
    ("mem_used", "gpu_mem_used_gib", 1 / GIB),
    ("pcie_rx", "pcie_rx_mb_s", 1e-6),  # bytes/s to MB/s (10^6)
    ("pcie_tx", "pcie_tx_mb_s", 1e-6),
    ("sm_clock", "sm_clock_mhz", 1.0),
    ("power_w", "power_w", 1.0),
)


@dataclass
class _Series:
    """One TensorBoard run's scalars: step -> tag -> value, and each step's seconds after the run start."""

    values: dict[int, dict[str, float]] = field(default_factory=dict)
    offset_s: dict[int, float] = field(default_factory=dict)

    def put(self, step: int, values: dict[str, float]) -> None:
        if values:
            self.values.setdefault(step, {}).update(values)


@dataclass
class TensorBoardExport:
    path: Path  # the run folder written (rank 0's; other ranks below it)
    scalars: int


class _EventSink:
    """One event per step holding all of that step's scalars (fewer records: a 100k-step run stays fast)."""

    def __init__(self, api: tuple[Any, Any], folder: Path) -> None:
        writer_cls, self._event_pb2 = api
        self._writer = writer_cls(str(folder), max_queue_size=1024)

    def add(self, step: int, wall_time: float, values: dict[str, float]) -> None:
        event = self._event_pb2.Event(wall_time=wall_time, step=step)
        for tag, value in values.items():
            event.summary.value.add(tag=tag, simple_value=value)
        self._writer.add_event(event)

    def close(self) -> None:
        self._writer.close()


def _writer_api() -> tuple[Any, Any]:
    """The lightest real event writer installed and its Event proto; a one-line ReportError naming the extra
    when there is none."""
    try:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        try:
            from tensorboardX.event_file_writer import EventFileWriter
            from tensorboardX.proto import event_pb2
        except ImportError:
            raise ReportError(MISSING_WRITER) from None
    return EventFileWriter, event_pb2


def write_tensorboard(doc: Any, out_dir: Path) -> int:
    """Write a ``pitstop.run/1``, ``pitstop.tune/1`` or ``pitstop.profile/1`` document as scalars into a
    new run folder under ``out_dir``; returns the number of scalars written."""
    return export_tensorboard(doc, out_dir).scalars


def export_tensorboard(doc: Any, out_dir: Path, run_name: str | None = None) -> TensorBoardExport:
    """As :func:`write_tensorboard`, and says which folder it wrote (``run_name`` chooses it)."""
    runs, start = _scalars_of(doc)
    api = _writer_api()
    folder = _new_run_folder(out_dir, run_name or _run_name(doc))
    count = 0
    for rank, series in sorted(runs.items()):
        sink = _EventSink(api, folder if rank == 0 else folder / f"rank{rank}")
        try:
            for step in sorted(series.values):
                values = series.values[step]
                sink.add(step, start + series.offset_s.get(step, 0.0), values)
                count += len(values)
        finally:
            sink.close()
    return TensorBoardExport(folder, count)


# -- what to write ---------------------------------------------------------------------------------------
def _scalars_of(doc: Any) -> tuple[dict[int, _Series], float]:
    """The scalars of each rank's run (rank 0 also holds the summary), and the run's start time."""
    if isinstance(doc, Diagnosis):
        return _run_series(doc), _started_at(doc.profile)
    if not isinstance(doc, dict):
        raise ReportError(f"not a pitstop document: a JSON {type(doc).__name__}, not an object")
    schema = doc.get("schema")
    if schema == schemas.TUNE:
        return {0: _tune_series(doc)}, time.time()
    if schema in (schemas.RUN, schemas.PROFILE):
        d = read_run(doc)
        return _run_series(d), _started_at(d.profile)
    raise ReportError(
        f"not a {schemas.RUN}, {schemas.TUNE} or {schemas.PROFILE} document (schema: {schema!r}): "
        "nothing to write for TensorBoard"
    )


def _run_series(d: Diagnosis) -> dict[int, _Series]:
    runs: dict[int, _Series] = {}
    last = 0
    for steps in d.results.series:
        series = runs.setdefault(steps.rank, _Series())
        _step_scalars(steps, _origin(d, steps.rank), series, _records_by_step(d, steps.rank))
        if steps.steps:
            last = max(last, steps.steps[-1])
    for window in d.results.gpus:
        if d.results.series_of(window.gpu) is None or _origin(d, window.gpu) is None:
            _gpu_by_sample(d, window, runs.setdefault(window.gpu, _Series()))
    totals = d.profile.totals
    if not last and totals is not None and totals.steps:
        last = totals.steps
    metrics = d.metrics.to_dict()
    summary = {f"pitstop/summary/{k}": _finite(metrics.get(k)) for k in SUMMARY_METRICS}
    runs.setdefault(0, _Series()).put(last, {k: v for k, v in summary.items() if v is not None})
    _rank_comm_summary(d, runs, last)
    return runs


def _rank_comm_summary(d: Diagnosis, runs: dict[int, _Series], last: int) -> None:
    """Each rank's waiting, communicating and arrival, in its own run: TensorBoard overlays the ranks per tag,
    which shows the one the others wait for."""
    if d.ranks_analysis is None:
        return
    for r in d.ranks_analysis.ranks:
        values = {
            "pitstop/summary/waiting_ms": r.wait_s * 1000,
            "pitstop/summary/communicating_ms": r.comm_s * 1000,
            "pitstop/summary/arrival_late_ms": r.late_s * 1000,
            "pitstop/summary/arrived_last_frac": r.last_frac,
        }
        runs.setdefault(r.rank, _Series()).put(
            last, {k: f for k, v in values.items() if (f := _finite(v)) is not None}
        )


def _origin(d: Diagnosis, rank: int) -> float | None:
    return next((r.window_start_t for r in d.profile.ranks if r.rank == rank), None)


def _step_scalars(
    steps: StepSeries, origin: float | None, series: _Series, collectives: dict[int, StepRecord]
) -> None:
    for i, step in enumerate(steps.steps):
        series.offset_s[step] = (origin or 0.0) + steps.end_s[i]
        values: dict[str, float | None] = {
            "pitstop/step_time_s": steps.wall_s[i],
            **{f"pitstop/{name}": column[i] for name, column in steps.phases.items() if name != "other_s"},
            "pitstop/tokens_per_s": steps.tokens_per_s[i],
            "pitstop/real_tokens_per_s": steps.real_tokens_per_s[i],
            "pitstop/padding_frac": steps.padding_frac[i],
            **_collective_scalars(collectives.get(step)),
        }
        if origin is not None:  # GPU samples sit on the step axis only where the window's start is known
            for name, tag, scale in GPU_FIELDS:
                mean = steps.gpu.get(name, [])[i] if name in steps.gpu else None
                values[f"pitstop/{tag}"] = None if mean is None else mean * scale
        series.put(step, {k: f for k, v in values.items() if (f := _finite(v)) is not None})


def _records_by_step(d: Diagnosis, rank: int) -> dict[int, StepRecord]:
    """A rank's step records by step number, for what the step series does not carry (collectives)."""
    profile = next((r for r in d.profile.ranks if r.rank == rank), None)
    if profile is None:
        return {}
    return {profile.warmup_steps + i + 1: s for i, s in enumerate(profile.steps)}


def _collective_scalars(record: StepRecord | None) -> dict[str, float | None]:
    if record is None or record.collectives is None:
        return {}
    return {
        "pitstop/collectives": record.collectives,
        "pitstop/collective_mb": None if record.collective_bytes is None else record.collective_bytes / 1e6,
        "pitstop/collective_blocked_s": record.collective_blocked_s,
    }


def _gpu_by_sample(d: Diagnosis, window: GpuWindow, series: _Series) -> None:
    """A GPU with no step axis (an nvidia-smi log, a trace): its window's samples by index."""
    rank = next(r for r in d.profile.ranks if r.rank == window.gpu)
    for i, sample in enumerate(rank.gpu_samples[window.first : window.last]):
        values = {
            f"pitstop/by_sample/{tag}": None if (v := getattr(sample, name)) is None else v * scale
            for name, tag, scale in GPU_FIELDS
        }
        series.put(i, {k: f for k, v in values.items() if (f := _finite(v)) is not None})
        series.offset_s.setdefault(i, sample.t)


def _tune_series(doc: dict[str, Any]) -> _Series:
    """The baseline, each fix tried and the best configuration, one point each at step 0."""
    values: dict[str, float] = {}
    baseline = doc.get("baseline") or {}
    base_tps = _finite(baseline.get("real_tokens_per_s"))
    if base_tps is not None:
        values["pitstop_tune/baseline/real_tokens_per_s"] = base_tps
        values["pitstop_tune/baseline/speedup"] = 1.0
    entries = [(c.get("fix"), c) for c in doc.get("candidates") or [] if isinstance(c, dict)]
    best = doc.get("best")
    if isinstance(best, dict):
        entries.append(("best", best))
    for name, entry in entries:
        if not isinstance(name, str) or not name:
            continue
        for key in ("real_tokens_per_s", "speedup"):
            value = _finite(entry.get(key))
            if value is not None:
                values[f"pitstop_tune/{name}/{key}"] = value
    series = _Series()
    series.put(0, values)
    return series


# -- where and when --------------------------------------------------------------------------------------
def _started_at(profile: RunProfile | None) -> float:
    """The run's start as a Unix time (the export's time where the profile does not say)."""
    stamp = profile.started_at if profile is not None else None
    if stamp:
        try:
            return datetime.fromisoformat(stamp).timestamp()
        except ValueError:
            pass
    return time.time()


def _run_name(doc: Any) -> str:
    if isinstance(doc, Diagnosis):
        kind = doc.profile.source or "run"
    else:
        kind = "tune" if doc.get("schema") == schemas.TUNE else str(doc.get("source") or "run")
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in kind)
    return f"pitstop-{safe}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}"


def _new_run_folder(out_dir: Path, name: str) -> Path:
    """A folder that did not exist: a second export in the same second gets a suffix, never a merge."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        folder = out_dir / (name if n == 1 else f"{name}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
