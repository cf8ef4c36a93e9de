"""Read the probed processes' rank files while the job runs, handing over only what is new.

A rank file (``probe/stream.py``) is one JSON object a line, appended per step (``start``, ``environment``,
``step``, ``gpu``, ``profile``); it is tailed by byte offset, so steps arrive while the job runs and
``pitstop watch`` reports a change when it happens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.profile import Environment, GpuSample, StepRecord, from_jsonable


@dataclass
class News:
    """What one rank measured since the last poll."""

    rank: int
    steps: list[StepRecord] = field(default_factory=list)
    gpu: list[GpuSample] = field(default_factory=list)
    environment: Environment | None = None


@dataclass
class _Tail:
    offset: int = 0
    rank: int | None = None
    warmup: int = 0
    partial: str = ""


class RankFollower:
    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self._tails: dict[Path, _Tail] = {}
        self._done: set[Path] = set()
        self._last: dict[int, int] = {}  # rank -> last step index handed over

    def poll(self) -> list[News]:
        """New steps, GPU samples and environments per rank, in step order, each handed over once."""
        news: dict[int, News] = {}
        for path in sorted(self.out_dir.glob("rank-*.jsonl")):
            self._read_lines(path, news)
        return [news[r] for r in sorted(news) if news[r].steps or news[r].gpu or news[r].environment]

    def _take(self, news: dict[int, News], rank: int, steps: list[StepRecord]) -> News:
        item = news.setdefault(rank, News(rank))
        last = self._last.get(rank, 0)
        fresh = [s for s in steps if s.index > last]
        if fresh:
            self._last[rank] = fresh[-1].index
            item.steps += fresh
        return item

    def _read_lines(self, path: Path, news: dict[int, News]) -> None:
        tail = self._tails.setdefault(path, _Tail())
        try:
            with path.open("rb") as f:
                f.seek(tail.offset)
                chunk = f.read()
        except OSError:
            return
        tail.offset += len(chunk)
        text = tail.partial + chunk.decode("utf-8", errors="replace")
        lines = text.split("\n")
        tail.partial = lines.pop()  # an unfinished last line waits for its end
        for raw in lines:
            try:
                item = json.loads(raw)
            except ValueError:
                continue
            if isinstance(item, dict):
                self._apply(tail, item, news)

    def _apply(self, tail: _Tail, item: dict[str, Any], news: dict[int, News]) -> None:
        kind = item.get("kind")
        if kind == "start":
            tail.rank = int(item.get("rank", 0))
            tail.warmup = int(item.get("warmup", 0))
            return
        rank = tail.rank if tail.rank is not None else int(item.get("rank", 0))
        if kind == "environment" and "environment" in item:
            tail.rank = int(item.get("rank", rank))
            news.setdefault(tail.rank, News(tail.rank)).environment = from_jsonable(
                Environment, item["environment"]
            )
        elif kind == "step":
            record = from_jsonable(StepRecord, item["step"])
            if record.index > tail.warmup:
                self._take(news, rank, [record])
        elif kind == "gpu":
            news.setdefault(rank, News(rank)).gpu += [from_jsonable(GpuSample, s) for s in item["samples"]]
