"""Read the probed processes' rank files while the job runs, handing over only what is new.

A rank file (``probe/stream.py``) is one JSON object a line, appended per step; it is tailed by byte offset and
each whole line decoded by the rank file's codec (``probe/rankfile.py``) into the file's ``RankDraft``, so steps
arrive while the job runs and ``pitstop watch`` reports a change when it happens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pitstop.core.profile import Environment, GpuSample, StepRecord
from pitstop.probe.rankfile import EnvironmentSeen, GpuReadings, RankDraft, Step, decode
from pitstop.probe.stream import PATTERN


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
    partial: str = ""
    # who the rank is (its start and environment lines); its steps and readings are handed on, not kept
    draft: RankDraft = field(default_factory=lambda: RankDraft(keep=False))


class RankFollower:
    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self._tails: dict[Path, _Tail] = {}
        self._done: set[Path] = set()
        self._last: dict[int, int] = {}  # rank -> last step index handed over

    def poll(self) -> list[News]:
        """New steps, GPU samples and environments per rank, in step order, each handed over once."""
        news: dict[int, News] = {}
        for path in sorted(self.out_dir.glob(PATTERN)):
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
            record = decode(raw)
            if record is None:
                continue
            draft = tail.draft
            draft.add(record)
            rank = draft.rank
            if isinstance(record, EnvironmentSeen) and record.environment is not None:
                news.setdefault(rank, News(rank)).environment = record.environment
            elif isinstance(record, Step) and record.record.index > draft.warmup:
                self._take(news, rank, [record.record])
            elif isinstance(record, GpuReadings):
                news.setdefault(rank, News(rank)).gpu += record.samples
