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

import bisect
import itertools
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pitstop import schemas
from pitstop.cli.errors import UserError
from pitstop.profile import GpuSample, RankProfile, RunProfile, StepRecord

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
    """The lightest real event writer installed and its Event proto; a one-line UserError naming the extra
    when there is none."""
    try:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        try:
            from tensorboardX.event_file_writer import EventFileWriter
            from tensorboardX.proto import event_pb2
        except ImportError:
            raise UserError(MISSING_WRITER) from None
    return EventFileWriter, event_pb2


def write_tensorboard(doc: dict[str, Any], out_dir: Path) -> int:
    """Write a ``pitstop.run/1``, ``pitstop.tune/1`` or ``pitstop.profile/1`` document as scalars into a
    new run folder under ``out_dir``; returns the number of scalars written."""
    return export_tensorboard(doc, out_dir).scalars


def export_tensorboard(doc: dict[str, Any], out_dir: Path, run_name: str | None = None) -> TensorBoardExport:
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
def _scalars_of(doc: dict[str, Any]) -> tuple[dict[int, _Series], float]:
    """The scalars of each rank's run (rank 0 also holds the summary), and the run's start time."""
    if not isinstance(doc, dict):
        raise UserError(f"not a pitstop document: a JSON {type(doc).__name__}, not an object")
    schema = doc.get("schema")
    if schema == schemas.TUNE:
        return {0: _tune_series(doc)}, time.time()
    if schema == schemas.RUN:
        profile = RunProfile.from_dict(doc["profile"]) if isinstance(doc.get("profile"), dict) else None
        return _run_series(profile, doc.get("metrics") or {}), _started_at(profile)
    if schema == schemas.PROFILE:
        from pitstop.diagnose.metrics import compute_metrics

        profile = RunProfile.from_dict(doc)
        return _run_series(profile, compute_metrics(profile).to_dict()), _started_at(profile)
    raise UserError(
        f"not a {schemas.RUN}, {schemas.TUNE} or {schemas.PROFILE} document (schema: {schema!r}): "
        "nothing to write for TensorBoard"
    )


def _run_series(profile: RunProfile | None, metrics: dict[str, Any]) -> dict[int, _Series]:
    runs: dict[int, _Series] = {}
    last = 0
    for rank in profile.ranks if profile is not None else []:
        series = runs.setdefault(rank.rank, _Series())
        _step_scalars(rank, series)
        _gpu_scalars(rank, series)
        if rank.steps:
            last = max(last, rank.warmup_steps + len(rank.steps))
    if not last and profile is not None and profile.totals is not None and profile.totals.steps:
        last = profile.totals.steps
    summary = {f"pitstop/summary/{k}": _finite(metrics.get(k)) for k in SUMMARY_METRICS}
    runs.setdefault(0, _Series()).put(last, {k: v for k, v in summary.items() if v is not None})
    return runs


def _step_scalars(rank: RankProfile, series: _Series) -> None:
    origin = rank.window_start_t or 0.0
    ends = itertools.accumulate(s.wall_s for s in rank.steps)
    for i, (s, end) in enumerate(zip(rank.steps, ends, strict=True)):
        step = rank.warmup_steps + i + 1
        series.offset_s[step] = origin + end
        values = {
            "pitstop/step_time_s": s.wall_s,
            "pitstop/data_wait_s": s.data_wait_s,
            "pitstop/forward_s": s.forward_s,
            "pitstop/backward_s": s.backward_s,
            "pitstop/optimizer_s": s.optimizer_s,
            "pitstop/collectives": s.collectives,
            "pitstop/collective_mb": None if s.collective_bytes is None else s.collective_bytes / 1e6,
            "pitstop/collective_blocked_s": s.collective_blocked_s,
            **_rates(s),
        }
        series.put(step, {k: f for k, v in values.items() if (f := _finite(v)) is not None})


def _rates(s: StepRecord) -> dict[str, float | None]:
    if s.wall_s <= 0:
        return {}
    rates: dict[str, float | None] = {
        "pitstop/tokens_per_s": None if s.tokens is None else s.tokens / s.wall_s,
        "pitstop/real_tokens_per_s": None if s.real_tokens is None else s.real_tokens / s.wall_s,
    }
    if s.tokens and s.real_tokens is not None:
        rates["pitstop/padding_frac"] = 1.0 - s.real_tokens / s.tokens
    return rates


def _gpu_scalars(rank: RankProfile, series: _Series) -> None:
    if not rank.gpu_samples:
        return
    if not rank.steps or rank.window_start_t is None:
        for i, sample in enumerate(rank.gpu_samples):
            series.put(i, _gpu_means([sample], "pitstop/by_sample/"))
            series.offset_s.setdefault(i, sample.t)
        return
    ends = list(itertools.accumulate(s.wall_s for s in rank.steps))
    by_step: dict[int, list[GpuSample]] = {}
    for sample in rank.gpu_samples:
        offset = sample.t - rank.window_start_t
        if 0 <= offset < ends[-1]:  # not warm-up, not after the last measured step
            step = rank.warmup_steps + bisect.bisect_right(ends, offset) + 1
            by_step.setdefault(step, []).append(sample)
    for step, samples in by_step.items():
        series.put(step, _gpu_means(samples, "pitstop/"))


def _gpu_means(samples: list[GpuSample], prefix: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for field_name, tag, scale in GPU_FIELDS:
        values = [v for s in samples if (v := _finite(getattr(s, field_name))) is not None]
        if values:
            out[prefix + tag] = math.fsum(values) / len(values) * scale
    return out


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


def _run_name(doc: dict[str, Any]) -> str:
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
