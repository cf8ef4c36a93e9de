"""The full per-step series of a watched run, on disk and compressed, so memory stays flat while the final
report can still draw every step. One gzip member per window is appended (gzip readers read members in a row),
so a run killed mid-way keeps every window it closed."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

from pitstop.core.profile import StepRecord, from_jsonable, to_jsonable


class SeriesStore:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def path(self, rank: int) -> Path:
        return self.folder / f"steps-rank{rank:05d}.jsonl.gz"

    def append(self, rank: int, steps: list[StepRecord]) -> None:
        if not steps:
            return
        text = "".join(json.dumps(to_jsonable(s), separators=(",", ":")) + "\n" for s in steps)
        with gzip.open(self.path(rank), "ab", compresslevel=6) as f:
            f.write(text.encode())

    def read(self, rank: int) -> Iterator[StepRecord]:
        path = self.path(rank)
        if not path.exists():
            return
        with gzip.open(path, "rt") as f:
            try:
                for line in f:
                    yield from_jsonable(StepRecord, json.loads(line))
            except (EOFError, OSError, ValueError):
                return  # a member cut short by a kill: the windows before it are whole

    def ranks(self) -> list[int]:
        return sorted(
            int(p.name[len("steps-rank") : -len(".jsonl.gz")])
            for p in self.folder.glob("steps-rank*.jsonl.gz")
        )
