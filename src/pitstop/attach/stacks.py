"""The sampled data: one thread's stacks in the order they were taken. Plain data, no py-spy here, so the
classification and step counting are tested on recorded or hand-made samples."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Frame:
    """One Python frame: the function's (qualified) name, its file, and the line it was on when sampled (0:
    not known). A call into C (``gc.collect()``) has no frame of its own: the caller's line shows it."""

    name: str
    file: str
    line: int = 0


Stack = tuple[Frame, ...]  # outermost first


@dataclass
class ThreadSamples:
    """The stacks of one thread, one per sampling tick (idle ticks included), in time order."""

    pid: int
    tid: int
    name: str
    interval_s: float
    stacks: list[Stack] = field(default_factory=list)

    @property
    def is_main(self) -> bool:
        return self.pid == self.tid

    @property
    def seconds(self) -> float:
        return len(self.stacks) * self.interval_s
