"""The rank file: what one probed process has measured so far, one JSON object a line, written as it happens.

Why lines, flushed one by one: the job can die at any moment (the OOM killer's SIGKILL, a segfault, a SIGTERM
from a scheduler) and no code of the probe runs then. Every complete line is already in the kernel's hands, so
the runner reads whatever was measured up to the death. A process that finishes cleanly ends its file with
one ``profile`` line holding the whole RankProfile, which then wins over the lines before it.

Lines (``kind``): ``start`` (rank, pid, warm-up), ``environment`` (captured at the first optimizer step),
``window`` (the measured window opened), ``step`` (one finished StepRecord), ``gpu`` / ``host`` (new sampler
readings), ``error`` (the probe disabled itself), ``profile`` (the finished RankProfile).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pitstop.profile import (
    Environment,
    GpuSample,
    HostSample,
    RankProfile,
    StepRecord,
    from_jsonable,
    to_jsonable,
)

PATTERN = "rank-*.jsonl"
_COUNTS = ("samples", "tokens", "real_tokens", "loss_tokens", "examples")


def stream_path(out_dir: Path, pid: int) -> Path:
    return out_dir / f"rank-{pid}.jsonl"


def plain_step(record: StepRecord) -> dict[str, Any]:
    """A step as JSON; counts still on the device (read only at the end of a window) go as unknown."""
    data: dict[str, Any] = to_jsonable(record)
    for name in _COUNTS:
        if not isinstance(data[name], int | None):
            data[name] = None
    return data


def window_steps(records: list[StepRecord], warmup: int) -> tuple[list[StepRecord], int]:
    """The measured steps and the warm-up they follow; a run that ended inside the warm-up keeps the steps
    after its first (the first carries start-up costs)."""
    steps = [r for r in records if r.index > warmup]
    if not steps and len(records) > 1:
        return records[1:], 1
    return steps, warmup


class RankStream:
    """Appends lines to this process's rank file, each flushed at once. Opened on the first line, so a
    process that never measures anything (a DataLoader worker) leaves no file; a forked child that does
    measure (a trainer started by fork) writes a file of its own, never into its parent's."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self._pid = os.getpid()
        self._file: IO[str] | None = None
        self._lock = threading.Lock()

    def write(self, kind: str, **payload: Any) -> None:
        line = json.dumps({"kind": kind, **payload}, separators=(",", ":")) + "\n"
        with self._lock:
            if os.getpid() != self._pid:  # forked: the inherited file is the parent's
                self._pid, self._file = os.getpid(), None
            if self._file is None:
                self._file = open(stream_path(self.out_dir, self._pid), "a", encoding="utf-8")  # noqa: SIM115
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None and os.getpid() == self._pid:
                self._file.close()
            self._file = None

    @property
    def pid(self) -> int:
        return self._pid


@dataclass
class _Lines:
    start: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] | None = None
    window_t: float | None = None
    steps: list[StepRecord] = field(default_factory=list)
    last_t: float | None = None
    gpu: list[GpuSample] = field(default_factory=list)
    host: list[HostSample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    profile: RankProfile | None = None


def _apply(lines: _Lines, item: dict[str, Any]) -> None:
    kind = item.get("kind")
    if kind == "start":
        lines.start = item
    elif kind == "environment":
        lines.environment = item
    elif kind == "window":
        lines.window_t = float(item["t"])
    elif kind == "step":
        lines.steps.append(from_jsonable(StepRecord, item["step"]))
        lines.last_t = float(item["t"])
    elif kind == "gpu":
        lines.gpu += [from_jsonable(GpuSample, s) for s in item["samples"]]
    elif kind == "host":
        lines.host += [from_jsonable(HostSample, s) for s in item["samples"]]
    elif kind == "error":
        lines.errors.append(str(item["text"]))
    elif kind == "profile":
        lines.profile = from_jsonable(RankProfile, item["profile"])


def read_stream(path: Path) -> tuple[RankProfile, bool] | None:
    """The RankProfile a rank file holds and whether the process finished it (False: it died first and
    this is rebuilt from its lines). A line cut short by the death, or damaged, is skipped."""
    lines = _Lines()
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    raw_lines = text.splitlines()
    last = _last_item(raw_lines)
    if last is not None and last.get("kind") == "profile":  # finished: the step lines need no reading
        with contextlib.suppress(ValueError, TypeError, KeyError):
            _apply(lines, last)
        if lines.profile is not None:
            return lines.profile, True
    for raw in raw_lines:
        try:
            item = json.loads(raw)
            if isinstance(item, dict):
                _apply(lines, item)
        except (ValueError, TypeError, KeyError):
            continue
    if lines.profile is not None:
        return lines.profile, True
    if not lines.start and not lines.errors:
        return None
    return _rebuild(lines), False


def _last_item(raw_lines: list[str]) -> dict[str, Any] | None:
    for raw in reversed(raw_lines):
        if raw.strip():
            try:
                item = json.loads(raw)
            except ValueError:
                return None
            return item if isinstance(item, dict) else None
    return None


def _rebuild(lines: _Lines) -> RankProfile:
    start, env_line = lines.start, lines.environment or {}
    environment = (
        from_jsonable(Environment, env_line["environment"]) if "environment" in env_line else Environment()
    )
    steps, warmup = window_steps(lines.steps, int(start.get("warmup", 0)))
    return RankProfile(
        rank=int(env_line.get("rank", start.get("rank", 0))),
        local_rank=int(env_line.get("local_rank", start.get("local_rank", 0))),
        pid=start.get("pid"),
        hostname=environment.hostname,
        warmup_steps=warmup,
        steps=steps,
        gpu_samples=lines.gpu,
        host_samples=lines.host,
        window_start_t=lines.window_t,
        window_end_t=lines.last_t,
        environment=environment,
        probe_errors=lines.errors,
    )
